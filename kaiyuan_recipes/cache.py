"""The user cache (KAIYUAN_CACHE, default ~/.cache/kaiyuan_recipes): the bundled tokenizer and the tokenized
sample corpus are written there on first use, by one process at a time."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def cache_root() -> Path:
    return Path(os.environ.get("KAIYUAN_CACHE", Path.home() / ".cache" / "kaiyuan_recipes"))


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One process prepares a cache entry; concurrent ones (ranks, two commands) wait, then find it ready.
    Not re-entrant: a process holding `name` must not ask for it again."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
