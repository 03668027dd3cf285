"""Hugging Face directory → Megatron torch_dist checkpoint, for continuing training from HF weights
(`checkpoint.pretrained_checkpoint=<out>`). The model is our provider built from the recipe's
model.yaml (the same module tree training builds, local spec), filled through AutoBridge's weight
mappings and saved with Megatron-Bridge's own checkpoint writer, to a temporary directory that is
renamed when complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kaiyuan_recipes.atomic import atomic_directory, require_new_output
from kaiyuan_recipes.export.megatron_to_hf import bridge_for, ensure_single_process_group, single_rank_overrides
from kaiyuan_recipes.models.shape import ModelShape

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def build_cpu_model(
    shape: ModelShape | dict[str, Any], dtype: torch.dtype = torch.float32, layer_spec: str = "local"
) -> Any:
    """Our provider's GPTModel on the CPU (one process group of one rank must exist); the local spec unless
    told (`auto` would pick the fast spec on a CUDA host, for a model that stays on the CPU)."""
    from kaiyuan_recipes.fastpath import TRAINING_STEP_MODEL_FIELDS
    from kaiyuan_recipes.models.providers import build_provider, provide_on_cpu

    fields = dict(ModelShape.of(shape).fields)
    # not a training step: its fused weight-gradient GEMM off (on a TE host Bridge defaults it on, which the output
    # layer refuses without Apex), as for every model rebuilt outside training
    provider = build_provider(fields | {"activation_func": fields.get("activation_func", "silu")}
                              | TRAINING_STEP_MODEL_FIELDS | (single_rank_overrides(fields) or {}), layer_spec)
    provider.params_dtype = dtype
    provider.bf16 = dtype == torch.bfloat16
    provider.fp16 = dtype == torch.float16
    return provide_on_cpu(provider).to(dtype)  # norms too, as Float16Module holds them in training


def hf_dtype(hf_dir: Path) -> torch.dtype:
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    return DTYPES.get(str(config.get("dtype") or config.get("torch_dtype") or "float32"), torch.float32)


def import_hf(hf_dir: Path, out: Path, shape: ModelShape | dict[str, Any]) -> Path:
    """Write the HF weights in `hf_dir` as a Megatron checkpoint (iteration 0, no optimizer) at `out`."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (expected a Hugging Face model directory)")
    require_new_output(out)
    ensure_single_process_group()
    bridge = bridge_for(shape, tokenizer_dir=hf_dir if (hf_dir / "tokenizer.json").is_file() else None)
    model = build_cpu_model(shape, hf_dtype(hf_dir))
    bridge.load_hf_weights([model], str(hf_dir))
    with atomic_directory(out) as tmp:
        bridge.save_megatron_model([model], tmp)
    return out
