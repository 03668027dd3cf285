"""Which pieces of the fast path a run uses, and why: decided once, on the final config, from the knobs.

Every on/off decision of the fast path is in this file; fastpath/install.py installs what the plan says and
nothing else, and the dry-run summary prints the plan."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from kaiyuan_recipes.config.knobs import AUTO, Knobs


@dataclass(frozen=True)
class Piece:
    on: bool
    reason: str  # why it is on or off, shown by the dry run


@dataclass
class FastPathPlan:
    pieces: dict[str, Piece]
    sdpa_backend: str

    def on(self, name: str) -> bool:
        return self.pieces[name].on

    def summary(self) -> dict[str, str]:
        return {name: f"{'on' if p.on else 'off'} ({p.reason})" for name, p in self.pieces.items()}


def _gate(*conditions: tuple[bool, str], reason_on: str) -> Piece:
    """On when every (condition, reason if false) holds; else off with the first failing reason."""
    for ok, why_not in conditions:
        if not ok:
            return Piece(False, why_not)
    return Piece(True, reason_on)


def graph_ineligible_reason(cfg: Any, knobs: Knobs) -> str | None:
    """Why `auto` leaves the whole-step CUDA graph off, or None: it is on only where it was measured (the fast
    spec, ZeRO 0/1, a dense model, no tensor or pipeline parallelism)."""
    m = cfg.model
    if knobs.layer_spec != "fast":
        return f"layer_spec={knobs.layer_spec}"
    if knobs.zero_stage > 1:
        return "ZeRO 2 (Megatron-FSDP)"
    if getattr(m, "num_moe_experts", None):
        return "MoE (per-batch expert shapes)"
    if m.tensor_model_parallel_size != 1 or m.pipeline_model_parallel_size != 1:
        return "tensor or pipeline parallel"
    return None


def wgrad_accumulation_available() -> bool:
    """Apex's extension is there, or torch's addmm takes out_dtype (torch 2.8+: apex_standins can stand in)."""
    import torch
    from megatron.core.tensor_parallel import layers

    return bool(layers._grad_accum_fusion_available) or hasattr(torch.ops.aten.addmm, "dtype_out")


def upstream_clip_is_per_parameter() -> bool:
    """Without Apex / TE megatron-core clips gradients through its per-parameter fallback."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    from kaiyuan_recipes.fastpath.apex_standins import _foreach_l2_norm

    return clip_grads.l2_norm_impl in (utils.local_multi_tensor_l2_norm, _foreach_l2_norm)


def upstream_adam_is_torch() -> bool:
    """megatron-core steps torch's Adam/AdamW only where neither TE nor Apex imports (their FusedAdam otherwise),
    and only torch's can be switched to its fused kernel."""
    from megatron.core import optimizer

    from kaiyuan_recipes.fastpath.fused_adamw import FUSABLE

    return issubclass(optimizer.Adam, FUSABLE)


def _step_fusion(cfg: Any, knobs: Knobs) -> tuple[Piece, Piece]:
    """cuda_graph / wgrad_fusion. auto turns both on together where graph_ineligible_reason finds nothing: the fused
    weight-gradient GEMMs paid off only in a replayed graph (benchmarks/README.md, step fusion)."""
    reason = graph_ineligible_reason(cfg, knobs)
    if knobs.wgrad_fusion is True and (knobs.layer_spec != "fast" or knobs.zero_stage > 1):
        raise ValueError("kaiyuan.wgrad_fusion needs kaiyuan.layer_spec=fast (a CUDA kernel) and kaiyuan.zero_stage "
                         f"0 or 1 (Megatron-FSDP's path needs TE); got layer_spec={knobs.layer_spec}, "
                         f"zero_stage={knobs.zero_stage}")
    if knobs.cuda_graph == AUTO:
        graph = Piece(reason is None, "auto" if reason is None else f"auto: {reason}")
    else:
        graph = Piece(bool(knobs.cuda_graph), f"kaiyuan.cuda_graph={str(knobs.cuda_graph).lower()}")
    if knobs.wgrad_fusion == AUTO:
        wgrad = _gate((reason is None, f"auto: {reason}"), (graph.on, "auto: with the CUDA graph only"),
                      (wgrad_accumulation_available(), "no Apex and torch's addmm lacks out_dtype"),
                      reason_on="auto: with the CUDA graph")
    elif knobs.wgrad_fusion:
        if not wgrad_accumulation_available():
            raise ValueError("kaiyuan.wgrad_fusion needs torch.addmm(..., out_dtype=) (torch 2.8+) or Apex")
        wgrad = Piece(True, "kaiyuan.wgrad_fusion=true")
    else:
        wgrad = Piece(False, "kaiyuan.wgrad_fusion=false")
    return graph, wgrad


# The specs `kaiyuan.chunked_loss=auto` puts the chunked loss on: the local spec stays upstream's reference as is.
CHUNKED_LOSS_AUTO_SPECS = ("fast", "transformer_engine")


def _chunked_loss(cfg: Any, knobs: Knobs) -> Piece:
    """auto: on the fast spec and TE's (TE's measured with it on both models: benchmarks/README.md, Transformer
    Engine), off on the local spec; true: on any spec, since every spec has megatron-core's same output layer."""
    from kaiyuan_recipes.fastpath.chunked_loss import unsupported_config_reason

    unsupported = unsupported_config_reason(cfg.model)
    if knobs.chunked_loss == AUTO:
        return _gate((knobs.layer_spec in CHUNKED_LOSS_AUTO_SPECS, f"auto: layer_spec={knobs.layer_spec}"),
                     (unsupported is None, f"auto: {unsupported}"),
                     reason_on="auto: logits never whole")
    return _gate((bool(knobs.chunked_loss), "kaiyuan.chunked_loss=false"), (unsupported is None, str(unsupported)),
                 reason_on="kaiyuan.chunked_loss=true: logits never whole")


def plan(cfg: Any, knobs: Knobs) -> FastPathPlan:
    """The fast path for this run; `knobs` has its layer spec resolved (never `auto`)."""
    fast = (knobs.layer_spec == "fast", f"layer_spec={knobs.layer_spec}")
    moe = bool(getattr(cfg.model, "num_moe_experts", None))
    graph, wgrad = _step_fusion(cfg, knobs)
    pieces = {
        "fast_spec": _gate(fast, reason_on="SDPA attention, compiled RoPE, TE-free fusions"),
        "sdpa_backend": _gate(fast, reason_on=f"kernel order: {knobs.sdpa_backend}"),
        "compiled_norm": _gate(fast, (knobs.compiled_norm, "kaiyuan.compiled_norm=false"), reason_on="RMSNorm"),
        "swiglu_backward": _gate(fast, (knobs.swiglu_backward, "kaiyuan.swiglu_backward=false"),
                                 (importlib.util.find_spec("triton") is not None, "no Triton"),
                                 reason_on="Triton kernel"),
        "grouped_experts": _gate(fast, (moe, "dense model"), reason_on="grouped GEMMs"),
        "chunked_loss": _chunked_loss(cfg, knobs),
        "fused_adamw": _gate(fast, (knobs.fused_adamw, "kaiyuan.fused_adamw=false"),
                             (not knobs.deterministic, "deterministic"),
                             (cfg.optimizer.optimizer == "adam", f"optimizer={cfg.optimizer.optimizer}"),
                             (not getattr(cfg.optimizer, "optimizer_cpu_offload", False), "optimizer CPU offload"),
                             (upstream_adam_is_torch(), "TE/Apex FusedAdam"), reason_on="one kernel"),
        "foreach_grad_clip": _gate((knobs.foreach_grad_clip, "kaiyuan.foreach_grad_clip=false"),
                                   (upstream_clip_is_per_parameter(), "Apex/TE clip"), reason_on="no Apex/TE"),
        "cuda_graph": graph,
        "wgrad_fusion": wgrad,
    }
    return FastPathPlan(pieces=pieces, sdpa_backend=knobs.sdpa_backend)
