"""What reading a fast-spec model's config needs in any process (training, export, serving), registered when
megatron.bridge is imported (compat.import_megatron_bridge). Not performance patches: a checkpoint's
run_config.yaml names our layer-spec function (Megatron-Bridge instantiates only allowlisted modules) and says
apply_rope_fusion=True, which megatron-core refuses while its fused-RoPE hooks are empty."""

from __future__ import annotations

# kaiyuan_recipes.fastpath.spec: where checkpoints written before the fast path had its own package name
# the layer spec.
CONFIG_TARGET_PREFIXES = ("kaiyuan_recipes.fastpath.", "kaiyuan_recipes.models.")


def register_loading_hooks() -> None:
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    from kaiyuan_recipes.fastpath.spec import register_compiled_rope

    for prefix in CONFIG_TARGET_PREFIXES:
        register_allowed_target_prefix(prefix)
    register_compiled_rope()
