"""How a workaround replaces an upstream method: once, marked, so applying it twice is a no-op. Shared by the
workarounds of every upstream (megatron_core.py, megatron_bridge.py), so it imports none of them."""

from __future__ import annotations

import functools
from typing import Any, Callable


def patch_method(cls: type, name: str, wrap: Callable[[Any], Any]) -> bool:
    """Replace cls.name by wrap(original) once (marked, so applying twice is a no-op); returns True."""
    original = getattr(cls, name)
    if getattr(original, "_kaiyuan_patched", False):
        return True
    patched = functools.wraps(original)(wrap(original))
    patched._kaiyuan_patched = True
    setattr(cls, name, patched)
    return True
