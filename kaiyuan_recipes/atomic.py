"""Writes that are complete or absent: to a temporary name beside the target, renamed when done."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` (UTF-8) through `.<name>.tmp` and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


@contextmanager
def atomic_directory(dest: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `dest`; when the block completes it becomes `dest`. An existing
    `dest` is an error unless `replace`; on any failure nothing is left behind."""
    dest = Path(dest)
    if dest.exists() and not replace:
        raise FileExistsError(f"{dest}: exists; choose a new output directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
