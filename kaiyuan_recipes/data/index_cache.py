"""Megatron's dataset index cache (`dataset.path_to_cache`): what makes an entry whole, and the staging folder the
pre-build (`kaiyuan data index`) builds into.

megatron-core's GPTDataset and BlendedDataset write an entry as a description file and two or three .npy files,
straight to their final names (numpy.save), and take the entry for cached when all of them exist. A process ended
while it writes the last one (a stop during a run's set-up, a killed job) leaves a truncated .npy that the next
start takes for cached and fails to load. `sweep_incomplete` removes such files (an entry missing a file is
rebuilt by Megatron). The pre-build never writes into the cache itself: it builds in a staging folder inside it
and moves each whole file in with a rename."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy

from kaiyuan_recipes.processes import pid_running

STAGING_PREFIX = ".staging-"  # + the building process's pid; Megatron reads only the files directly in the cache


def npy_is_whole(path: Path) -> bool:
    """Whether a .npy file holds all the bytes its header announces (numpy refuses to map a short one)."""
    try:
        numpy.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return False
    return True


def sweep_incomplete(cache: Path) -> list[Path]:
    """Remove the truncated .npy files directly in `cache` (their entries are then rebuilt); returns them."""
    removed = []
    if not cache.is_dir():
        return removed
    for path in sorted(cache.glob("*.npy")):
        if path.is_file() and not path.is_symlink() and not npy_is_whole(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def remove_stale_staging(cache: Path) -> list[Path]:
    """Staging folders whose process is gone (killed mid-build): removed."""
    removed = []
    for path in cache.glob(f"{STAGING_PREFIX}*") if cache.is_dir() else ():
        pid = path.name[len(STAGING_PREFIX):]
        if not pid.isdigit() or not pid_running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def open_staging(cache: Path) -> Path:
    """A staging folder in `cache` for this process, seeded with links to every cached file (so Megatron, pointed
    at it, loads what is cached and builds only what is missing)."""
    staging = cache / f"{STAGING_PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in cache.iterdir():
        if path.is_file():
            (staging / path.name).symlink_to(path.resolve())
    return staging


def publish_staging(staging: Path, cache: Path) -> list[Path]:
    """Move the files built in `staging` (not the links to cached ones) into `cache`, each with one rename, so the
    cache only ever holds whole files; the description files last. Removes `staging`; returns the files moved."""
    built = [p for p in staging.iterdir() if p.is_file() and not p.is_symlink()]
    built.sort(key=lambda p: (p.name.endswith("description.txt"), p.name))
    moved = []
    for path in built:
        target = cache / path.name
        os.replace(path, target)
        moved.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    return moved
