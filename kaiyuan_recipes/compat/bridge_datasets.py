"""Megatron-Bridge's dataset-provider contract for data/'s dataset configs, imported once, here, with the
workarounds in place (import_megatron_bridge: the dataset helpers' build is skipped where the wheel ships them)."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes.compat import import_megatron_bridge


def _provider_contract() -> tuple[Any, Any]:
    import_megatron_bridge()
    try:  # megatron-bridge 0.6 moved the dataset-provider contract to data/base.py (0.5: training/config.py)
        from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
    except ImportError:
        from megatron.bridge.training.config import DatasetBuildContext, DatasetProvider
    return DatasetBuildContext, DatasetProvider


DatasetBuildContext, DatasetProvider = _provider_contract()

__all__ = ["DatasetBuildContext", "DatasetProvider"]
