"""What reading a fast-spec model's config needs in any process (training, export, serving). Not performance
patches: a checkpoint's run_config.yaml names our layer-spec function and the run's plan our dataset classes
(Megatron-Bridge instantiates only allowlisted modules), and says apply_rope_fusion=True, which megatron-core refuses
while its fused-RoPE hooks are empty."""

from __future__ import annotations

import importlib
import sys
import types

from kaiyuan_recipes import compat

CONFIG_TARGET_PREFIXES = ("kaiyuan_recipes.fastpath.", "kaiyuan_recipes.data.")
# Module names that checkpoints written by earlier versions recorded in run_config.yaml, and where each lives now:
# registered under the old name only while reading a config back, so those checkpoints keep loading without a
# module left at the old path.
MOVED_CONFIG_MODULES = {"kaiyuan_recipes.models.fast_spec": "kaiyuan_recipes.fastpath.spec"}


def register_loading_hooks() -> None:
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    from kaiyuan_recipes.fastpath.spec import register_compiled_rope

    for prefix in CONFIG_TARGET_PREFIXES:
        register_allowed_target_prefix(prefix)
    for old, new in MOVED_CONFIG_MODULES.items():
        sys.modules.setdefault(old, importlib.import_module(new))
        register_allowed_target_prefix(old + ".")
    register_compiled_rope()


def prepare_megatron_bridge() -> types.ModuleType:
    """megatron.bridge with the upstream workarounds in place (compat.import_megatron_bridge) and the loading hooks
    registered: the entry point for a process that builds or reads back one of our models."""
    bridge = compat.import_megatron_bridge()
    register_loading_hooks()
    return bridge
