"""Which process a PID on record is. A PID alone is not an identity: after a reboot or a container restart it
names whatever process got the number next, and a state file can be edited. A supervisor records its PID with
its start time (/proc/PID/stat, clock ticks since boot), the boot id and its argv; a stop signals only a live
process that matches all of them, and never a PID below 1 (0 and -1 would signal whole groups)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class IdentityError(ValueError):
    pass


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after "pid (comm)": comm may hold spaces and parentheses


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_ticks: int
    boot_id: str
    argv: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The live process `pid` (None when gone, a zombie, unreadable, or pid < 1)."""
        if not isinstance(pid, int) or pid < 1:
            return None
        fields = _stat_fields(pid)
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        except OSError:
            return None
        if not fields or fields[0] == "Z" or len(fields) < 20:
            return None
        return cls(pid, int(fields[19]), boot_id(), argv)  # field 22 of stat: start time

    def is_alive(self) -> bool:
        """The recorded process still runs: same PID, start time, boot and argv."""
        return ProcessIdentity.of(self.pid) == self

    def save(self, path: Path) -> None:
        from kaiyuan_recipes.atomic import write_text_atomic

        write_text_atomic(path, json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> ProcessIdentity | None:
        """The identity recorded in `path`, None when there is none; anything `save` would not have written is
        an IdentityError naming the file (a state file is input, not code)."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise IdentityError(f"{path}: not a process record ({err})") from None
        ok = (isinstance(data, dict) and set(data) == {"pid", "start_ticks", "boot_id", "argv"}
              and type(data["pid"]) is int and data["pid"] >= 1 and type(data["start_ticks"]) is int
              and isinstance(data["boot_id"], str) and isinstance(data["argv"], list)
              and all(isinstance(a, str) for a in data["argv"]))
        if not ok:
            raise IdentityError(f"{path}: not a process record written by kaiyuan (expected pid >= 1, start_ticks, "
                                "boot_id, argv)")
        return cls(data["pid"], data["start_ticks"], data["boot_id"], tuple(data["argv"]))

