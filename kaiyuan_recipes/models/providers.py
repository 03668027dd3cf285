"""Megatron-Bridge GPTModelProvider configurations built offline from a model shape (models/shape.py).

Unlike upstream's Qwen3 recipes (AutoBridge.from_hf_pretrained), nothing here touches the hub."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes import compat
from kaiyuan_recipes.config.knobs import LAYER_SPECS
from kaiyuan_recipes.fastpath.loading import prepare_megatron_bridge

ACTIVATIONS = ("silu", "gelu", "relu")
# Stated in model.yaml for validation and HF export; RoPE models have no position table.
NOT_PROVIDER_FIELDS = ("max_position_embeddings",)


def _activation(name: str):
    import torch.nn.functional as F

    if name not in ACTIVATIONS:
        raise ValueError(f"model.activation_func: expected one of {ACTIVATIONS}, got {name!r}")
    return getattr(F, name)


def build_provider(shape: dict[str, Any], layer_spec: str = "auto"):
    """A GPTModelProvider from GPTModelProvider field names; `activation_func` given by name."""
    prepare_megatron_bridge()
    import dataclasses

    from megatron.bridge.models.gpt_provider import GPTModelProvider

    fields = {k: v for k, v in shape.items() if k not in NOT_PROVIDER_FIELDS}
    if isinstance(fields.get("activation_func"), str):
        fields["activation_func"] = _activation(fields["activation_func"])
    known = {f.name for f in dataclasses.fields(GPTModelProvider)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"model: unknown GPTModelProvider field(s) {unknown}")
    provider = GPTModelProvider(**fields)
    return select_layer_spec(provider, layer_spec)


def resolve_layer_spec(layer_spec: str = "auto", deterministic: bool = False) -> str:
    """`auto`: Transformer Engine's spec where TE is installed; without it the fast spec on a CUDA host
    (kaiyuan_recipes/fastpath/; measured against the local spec in benchmarks/README.md), and the local spec on a
    CPU-only host or under kaiyuan.deterministic (two same-seed runs of the fast spec part from step 3: SDPA's
    backward)."""
    if layer_spec not in LAYER_SPECS:
        raise ValueError(f"kaiyuan.layer_spec: expected one of {LAYER_SPECS}, got {layer_spec!r}")
    if layer_spec == "transformer_engine" and not compat.transformer_engine_available():
        raise RuntimeError("kaiyuan.layer_spec=transformer_engine, but transformer_engine is not installed")
    if layer_spec != "auto":
        return layer_spec
    if compat.transformer_engine_available():
        return "transformer_engine"
    import torch

    return "fast" if torch.cuda.is_available() and not deterministic else "local"


# TE's spec with Megatron-LM's own defaults for it (pretrain_gpt: RoPE and SwiGLU fused unless --no-rope-fusion /
# --no-bias-swiglu-fusion); Megatron-Bridge's GPTModelProvider leaves both unfused. The cross-entropy stays Bridge's
# fused native one: Megatron-LM rejects TE's (cross_entropy_fusion_impl='te', "stability issues"). Set on the
# provider, so a recipe's or the command line's model.* override still wins. Measured: benchmarks/README.md,
# Transformer Engine.
TE_SPEC_FUSIONS = {"apply_rope_fusion": True, "bias_activation_fusion": True}


def select_layer_spec(provider, layer_spec: str = "auto"):
    layer_spec = resolve_layer_spec(layer_spec)
    use_te = layer_spec == "transformer_engine"
    if use_te:
        import torch.nn.functional as F

        for key, value in TE_SPEC_FUSIONS.items():
            # megatron-core fuses the bias-activation pair only for SwiGLU / GeGLU when the MLP has no bias
            if key != "bias_activation_fusion" or (provider.gated_linear_unit
                                                   and provider.activation_func in (F.silu, F.gelu)):
                setattr(provider, key, value)
    else:
        compat.apply_local_spec_settings(provider)
    if layer_spec == "fast":  # the local spec with SDPA core attention (fastpath/spec.py)
        # (its compiled RoPE hooks are filled by prepare_megatron_bridge, which build_provider called)
        from kaiyuan_recipes.fastpath.spec import use_fast_spec

        use_fast_spec(provider)
    if provider.num_moe_experts:
        # Grouped GEMM experts need TE (TEGroupedMLP); the local spec runs them one by one (SequentialMLP).
        provider.moe_grouped_gemm = use_te
    return provider


def provide_on_cpu(provider):
    """Build the provider's GPTModel in this process on the CPU — what Megatron-Bridge's
    provide_distributed_model does, without a GPU or DDP wrapping. Megatron's model-parallel state of one
    rank must be initialised. Set any other provider fields before calling."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    provider.use_cpu_initialization = True
    provider.finalize()
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    return provider.provide()
