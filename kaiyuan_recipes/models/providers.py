"""Megatron-Bridge GPTModelProvider configurations built offline from recipes/<name>/model.yaml.

Unlike upstream's Qwen3 recipes (AutoBridge.from_hf_pretrained), nothing here touches the hub."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes import compat

from kaiyuan_recipes.training.knobs import LAYER_SPECS

ACTIVATIONS = ("silu", "gelu", "relu")


def _activation(name: str):
    import torch.nn.functional as F

    if name not in ACTIVATIONS:
        raise ValueError(f"model.activation_func: expected one of {ACTIVATIONS}, got {name!r}")
    return getattr(F, name)


def build_provider(shape: dict[str, Any], layer_spec: str = "auto"):
    """A GPTModelProvider from GPTModelProvider field names; `activation_func` given by name."""
    compat.import_megatron_bridge()
    import dataclasses

    from megatron.bridge.models.gpt_provider import GPTModelProvider

    from kaiyuan_recipes.models.shape import NOT_PROVIDER_FIELDS

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
    (kaiyuan_recipes/fastpath/; measured against the local spec in benchmarks/RESULTS.md), and the local spec on a
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


def select_layer_spec(provider, layer_spec: str = "auto"):
    layer_spec = resolve_layer_spec(layer_spec)
    use_te = layer_spec == "transformer_engine"
    if not use_te:
        compat.apply_local_spec_settings(provider)
    if layer_spec == "fast":  # the local spec with SDPA core attention (fastpath/spec.py)
        # (its compiled RoPE hooks are filled by compat.import_megatron_bridge, which build_provider called)
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


def provider_for_recipe(name: str, layer_spec: str = "auto"):
    from kaiyuan_recipes.models.shape import ModelShape

    return ModelShape.for_recipe(name).provider(layer_spec)


def gpt_smoke(layer_spec: str = "auto"):
    """~340M GPT (12 layers, 768 hidden, GQA 8/4, SwiGLU, RoPE, untied embeddings)."""
    return provider_for_recipe("gpt_smoke", layer_spec)


def qwen3_1p7b(layer_spec: str = "auto"):
    """Qwen3-1.7B shape: 28 layers, 2048 hidden, GQA 16/8, QK-norm, untied; 2.03B parameters."""
    return provider_for_recipe("qwen3_1p7b", layer_spec)


def laoyao_moe_2b(layer_spec: str = "auto"):
    """~2B-total / ~0.5B-active Qwen3-MoE-style model: 24 layers, 64 experts of 320, top-8, GLM-5.2 vocab."""
    return provider_for_recipe("laoyao_moe_2b", layer_spec)
