"""The GPU host's wheel set made small enough to travel with the tree in one call: a wheel that carries files the
host never runs is rewritten without them (its RECORD too). pulp ships the CBC solver's binaries for many
platforms (16 of its 16.4 MB); nvidia-modelopt imports pulp but runs no solver on the training, export or serving
path, so pulp/solverdir/cbc/ stays behind.

    python lab/slim_wheels.py .whl      # `make -C lab gpu-wheels` runs it; a second run changes nothing"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

# distribution name (as a wheel's file name spells it, lower case) -> member prefixes left out
SLIM = {"pulp": ("pulp/solverdir/cbc/",)}


def slim(wheel: Path, prefixes: tuple[str, ...]) -> int:
    """Rewrite `wheel` in place without the members under `prefixes` and their RECORD lines; the bytes left out
    (uncompressed). Written under a temporary name and renamed, so an interrupted run leaves the wheel whole."""
    dropped = 0
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w") as dst:
        for info in src.infolist():
            if info.filename.startswith(prefixes):
                dropped += info.file_size
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if not line.decode().startswith(prefixes))
            dst.writestr(info, data)
    os.replace(tmp, wheel)
    return dropped


def main(folder: Path) -> None:
    for wheel in sorted(folder.glob("*.whl")):
        prefixes = SLIM.get(wheel.name.split("-")[0].lower())
        if prefixes:
            dropped = slim(wheel, prefixes)
            print(f"{wheel.name}: {dropped / 1e6:.1f} MB left out, {wheel.stat().st_size / 1e6:.1f} MB now")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        raise SystemExit("usage: python lab/slim_wheels.py WHEEL_DIR")
    main(Path(sys.argv[1]))
