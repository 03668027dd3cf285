"""Writes that are complete or absent: to a temporary name beside the target, renamed when done."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` to `path` (UTF-8) through a fresh temporary name beside it and a rename. The temporary file
    is created exclusively (a planted symlink there is never followed) and the rename replaces a symlink at
    `path` instead of writing through it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE", re.IGNORECASE)
URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)


def redacted_env(env: dict[str, str]) -> dict[str, str]:
    """Environment values as they may be written to a state file: secrets by name redacted, and credentials
    inside URLs (https://user:pass@host) removed."""
    return {k: "<redacted>" if SECRET_NAME.search(k) else URL_USERINFO.sub(r"\g<scheme><redacted>@", v)
            for k, v in env.items()}


def require_new_output(dest: Path) -> Path:
    """An output directory a command creates: refused if it exists (checked first, before any slow work)."""
    if Path(dest).exists():
        raise FileExistsError(f"{dest}: exists; choose a new output directory")
    return Path(dest)


@contextmanager
def atomic_directory(dest: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `dest`; when the block completes it becomes `dest`. An existing
    `dest` is an error unless `replace`; on any failure nothing is left behind."""
    dest = Path(dest)
    if not replace:
        require_new_output(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
