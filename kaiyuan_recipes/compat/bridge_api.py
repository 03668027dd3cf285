"""Megatron-Bridge's Callback base class for the callbacks of training/ and fastpath/, imported once, here, with the
workarounds in place (apply). A module importing it from here needs no call of its own before its imports."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes.compat import apply


def _callback_base() -> Any:
    apply()
    from megatron.bridge.training.callbacks import Callback

    return Callback


Callback = _callback_base()

__all__ = ["Callback"]
