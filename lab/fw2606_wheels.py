"""The fw2606 wheel set for the GPU host (journey.sh --stack fw2606): the Bridge set (.whl, `make gpu-wheels`) with
every wheel whose package constraints/fw2606.txt pins at another version swapped for that version; what the lock
does not name (the host-only serving and client wheels) is kept as it is.

    python lab/fw2606_wheels.py .whl .whl-fw2606      # `make gpu-wheels-fw2606`"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from nemo2_wheels import PLATFORMS, read_lock, wheel_key

LOCK = Path(__file__).resolve().parents[1] / "constraints" / "fw2606.txt"
CARRY_LIMIT = 64 * 2**20  # what one device call carries, the working tree included


def plan(files: list[str], pins: dict[str, str]) -> tuple[list[str], list[str]]:
    """(files kept as they are, `name==version` pins to download in place of the others)."""
    keep, fetch = [], []
    for name in sorted(files):
        key = wheel_key(name)
        if key is not None and key[0] in pins and pins[key[0]] != key[1]:
            fetch.append(f"{key[0]}=={pins[key[0]]}")
        else:
            keep.append(name)
    return keep, fetch


def build(src: Path, dest: Path, python: str = sys.executable) -> list[str]:
    """DEST made afresh from SRC; the pins swapped in, as a list."""
    if not src.is_dir() or not any(src.glob("*.whl")):
        sys.exit(f"{src}: no wheels (make gpu-wheels first)")
    keep, fetch = plan([p.name for p in src.iterdir() if p.is_file()], read_lock(LOCK))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in keep:
        shutil.copy2(src / name, tmp / name)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *plat, "-d", str(tmp), *fetch], check=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # complete, or not there
    return fetch


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit(__doc__)
    src, dest = map(Path, argv)
    swapped = build(src, dest)
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"{dest}: {len(list(dest.iterdir()))} files, {size / 1e6:.1f} MB; swapped in: {' '.join(swapped)}")
    if size > CARRY_LIMIT - 6 * 2**20:
        print(f"{dest} with the working tree may exceed one call's 64 MiB: send it in parts "
              f"(python lab/stage.py pack fw2606 {dest})")


if __name__ == "__main__":
    main(sys.argv[1:])
