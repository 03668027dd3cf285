"""A NeMo 2 checkpoint's weights (dumped in the NeMo 2 environment by kaiyuan_recipes.nemo2.weights) → Hugging Face
directory: loaded into our provider's model of the recipe (local spec, as NeMo 2 builds without Transformer Engine)
and written by AutoBridge, as megatron_to_hf does for a Megatron-Bridge checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kaiyuan_recipes.atomic import require_new_output
from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
from kaiyuan_recipes.export.megatron_to_hf import bridge_for, ensure_single_process_group, write_hf_dir
from kaiyuan_recipes.models.shape import ModelShape
from kaiyuan_recipes.nemo2.weights import load_weights


def check_shape(path: Path, meta: dict[str, Any], shape: ModelShape) -> None:
    """The model config recorded at the dump against the recipe's: a checkpoint of another model is named, not
    loaded into the wrong shape."""
    recorded = meta.get("config") or {}
    differ = {k: (v, shape.get(k)) for k, v in recorded.items()
              if v is not None and shape.get(k) is not None and v != shape.get(k)}
    if differ:
        detail = ", ".join(f"{k}: checkpoint {a!r}, recipe {b!r}" for k, (a, b) in sorted(differ.items()))
        raise ValueError(f"{path}: the NeMo 2 checkpoint {meta.get('checkpoint')} is not this recipe's model "
                         f"({detail})")


def export_nemo2_hf(weights: Path, out: Path, shape: ModelShape, tokenizer_dir: Path | None = None,
                    show_progress: bool = True) -> Path:
    weights, out = Path(weights), Path(out)
    require_new_output(out)
    state, meta = load_weights(weights)
    check_shape(weights, meta, shape)
    ensure_single_process_group()
    dtype = next(iter(state.values())).dtype if state else torch.float32
    model = build_cpu_model(shape, dtype)
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{weights}: does not fit the recipe's local-spec model: missing {missing[:8]}"
                         f"{' …' if len(missing) > 8 else ''}, unexpected {result.unexpected_keys[:8]}")
    bridge = bridge_for(shape, tokenizer_dir=tokenizer_dir)
    return write_hf_dir(bridge, [model], out, tokenizer_dir, show_progress)
