"""The NeMo 2 wheel set for the GPU host (lab/nemo2-wheels.txt): read it, check it against
constraints/nemo2.txt, download it (CPU host), check a received folder against it (GPU host, standard library only).

    python lab/nemo2_wheels.py download DEST     # `make gpu-wheels-nemo2`: exactly the listed set in DEST
    python3 lab/nemo2_wheels.py check-dir DIR    # DIR holds the listed wheels, nothing else (nemo2_env.sh)

List lines are `name==version`, `name==version  # sdist` (no wheel exists: downloaded as source and built into a
wheel here, because pip on the offline host cannot get setuptools for an isolated build), or
`# host: name==version  why` (not shipped: the GPU host has that exact version)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIST = HERE / "nemo2-wheels.txt"
LOCK = HERE.parent / "constraints" / "nemo2.txt"
# The GPU host: glibc 2.39, CPython 3.12; pip matches each manylinux tag exactly, so all are named.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "any"]
# Kept from the host, never shipped: its torch build and the CUDA runtime that build was made with.
HOST_CUDA_STACK = re.compile(r"^(torch|triton|cuda-.+|nvidia-(cu.+|nccl.*|nvjitlink.*|nvshmem.*|nvtx.*))$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    sdist: bool = False
    host: bool = False  # a `# host:` line: the GPU host has this version, so it is not shipped

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def read_list(path: Path = LIST) -> list[Entry]:
    entries = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        host = line.startswith("# host:")
        if host:
            line = line[len("# host:"):].strip()
        elif not line or line.startswith("#"):
            continue
        spec, _, comment = line.partition("#")
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", spec.split()[0] if spec.split() else "")
        if not m:
            raise ValueError(f"{path}:{n}: expected name==version, got {raw!r}")
        entries.append(Entry(m.group(1), m.group(2), sdist="sdist" in comment.split(), host=host))
    return entries


def read_lock(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            pins[normalize(name)] = version
    return pins


def problems(entries: list[Entry], pins: dict[str, str]) -> list[str]:
    """What is wrong with the list against the lock: each a sentence naming the entry."""
    out, seen = [], set()
    for e in entries:
        key = normalize(e.name)
        if key in seen:
            out.append(f"{e.name} is listed twice")
        seen.add(key)
        if HOST_CUDA_STACK.match(key):
            out.append(f"{e.name} is the host's torch/CUDA stack and must not be listed")
        if key not in pins:
            out.append(f"{e.pin} is not in constraints/nemo2.txt")
        elif pins[key] != e.version:
            out.append(f"{e.pin} differs from constraints/nemo2.txt ({e.name}=={pins[key]})")
    return out


def wheel_key(filename: str) -> tuple[str, str] | None:
    """(normalized name, version) of a wheel file name, None for anything else."""
    if not filename.endswith(".whl"):
        return None
    name, version = filename[: -len(".whl")].split("-")[:2]
    return normalize(name), version


def compare_dir(folder: Path, entries: list[Entry]) -> tuple[list[str], list[str]]:
    """(listed wheels missing from folder, files in folder that are not listed wheels)."""
    want = {(normalize(e.name), e.version): e.pin for e in entries if not e.host}
    have = {wheel_key(p.name): p.name for p in folder.iterdir() if p.is_file()}
    missing = sorted(pin for key, pin in want.items() if key not in have)
    extra = sorted(name for key, name in have.items() if key not in want)
    return missing, extra


def download(dest: Path, python: str = sys.executable) -> None:
    entries = [e for e in read_list() if not e.host]
    bad = problems(read_list(), read_lock())
    if bad:
        sys.exit("lab/nemo2-wheels.txt: " + "; ".join(bad))
    dest.mkdir(parents=True, exist_ok=True)
    pip = [python, "-m", "pip"]
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *plat, "-d", str(dest), *(e.pin for e in entries if not e.sdist)],
                   check=True)
    sdists = dest / "sdist"
    for e in (e for e in entries if e.sdist):
        if (normalize(e.name), e.version) in {wheel_key(p.name) for p in dest.iterdir()}:
            continue
        subprocess.run([*pip, "download", "-q", "--no-deps", "--no-binary=:all:", "-d", str(sdists), e.pin], check=True)
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(dest), *map(str, sdists.iterdir())], check=True)
        for p in sdists.iterdir():
            p.unlink()
    if sdists.exists():
        sdists.rmdir()
    missing, extra = compare_dir(dest, entries)
    for name in extra:  # a wheel from an older list
        (dest / name).unlink()
    if missing:
        sys.exit(f"{dest}: not downloaded: {' '.join(missing)}")
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{dest}: {len(entries)} wheels, {size / 1e6:.1f} MB")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "download":
        download(Path(argv[1]))
    elif len(argv) == 2 and argv[0] == "check-dir":
        missing, extra = compare_dir(Path(argv[1]), read_list())
        if missing or extra:
            sys.exit(f"{argv[1]} is not the set of lab/nemo2-wheels.txt: missing {missing or 'none'}, "
                     f"not listed {extra or 'none'} (make gpu-wheels-nemo2; staged completely?)")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
