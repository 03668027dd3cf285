"""What /proc says about a process: its parent, state and argv, and whether it still runs. Ground floor: the
launch back-ends and the data cache both ask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class Proc(NamedTuple):
    ppid: int
    state: str  # "Z": a zombie, not running
    argv: list[str]


def read_proc(pid: int) -> Proc | None:
    """Parent, state and argv of `pid` from /proc; None once it is gone (or unreadable)."""
    entry = Path(f"/proc/{pid}")
    try:
        stat = (entry / "stat").read_bytes().decode(errors="replace")  # comm may be any bytes
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]  # after "pid (comm)"
        return Proc(int(ppid), state, [a.decode(errors="replace") for a in argv if a])
    except (OSError, ValueError, IndexError):  # exited meanwhile (empty or vanished files)
        return None


def processes() -> dict[int, Proc]:
    """Every process this user can see."""
    table = {int(e.name): read_proc(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    return {pid: proc for pid, proc in table.items() if proc is not None}


def pid_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (killed, not yet reaped by its parent). A pid owned by another
    user counts as running: we cannot tell it is not ours."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = read_proc(pid)
    return proc is None or proc.state != "Z"
