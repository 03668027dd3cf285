"""What the training and fast-path modules take from Megatron-Bridge, imported once, here, with the workarounds in
place (import_megatron_bridge): its Callback base class and the dataset-provider contract. A module importing them
from here needs no call of its own before its imports."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes.compat import import_megatron_bridge


def _bridge_names() -> tuple[Any, Any, Any]:
    import_megatron_bridge()
    from megatron.bridge.training.callbacks import Callback

    try:  # megatron-bridge 0.6 moved the dataset-provider contract to data/base.py (0.5: training/config.py)
        from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
    except ImportError:
        from megatron.bridge.training.config import DatasetBuildContext, DatasetProvider
    return Callback, DatasetBuildContext, DatasetProvider


Callback, DatasetBuildContext, DatasetProvider = _bridge_names()

__all__ = ["Callback", "DatasetBuildContext", "DatasetProvider"]
