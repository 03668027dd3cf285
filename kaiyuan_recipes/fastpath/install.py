"""Installs what a FastPathPlan turns on, and only that: the one place the fast path changes a config or patches
megatron-core (each patch is process-wide in the worker that builds the config, and idempotent)."""

from __future__ import annotations

from typing import Any

from kaiyuan_recipes.fastpath.decisions import FastPathPlan

# The model fields the cuda_graph and wgrad_fusion pieces set, with their off values. They decide how a training
# step runs (a captured graph, the fused weight-gradient GEMM), not the model's weights or maths; a checkpoint's
# run_config.yaml records them, and a model rebuilt outside training (export, serving, evaluation) takes these
# values instead: it has neither training's kernels nor its step.
TRAINING_STEP_MODEL_FIELDS: dict[str, Any] = {"cuda_graph_impl": "none", "use_te_rng_tracker": False,
                                             "gradient_accumulation_fusion": False}


def _full_step_cuda_graph(cfg: Any) -> None:
    """Each step's forward and backward captured once (megatron-core's full-iteration graph, after
    model.cuda_graph_warmup_steps eager steps) and replayed. It needs a graph-safe RNG tracker (without TE
    megatron-core's own, asked for through use_te_rng_tracker) and Megatron's per-micro-batch NaN check off
    (Bridge requires it: the check reads the loss on the host); training/loss_guard.py checks once a step.
    The distributed optimizer's parameter all-gather runs in its step instead of overlapping the next forward:
    that overlap waits for the gather in forward pre-hooks, Python that a replayed graph skips."""
    from kaiyuan_recipes import compat

    cfg.model.cuda_graph_impl = "full_iteration"
    cfg.model.use_te_rng_tracker = cfg.rng.te_rng_tracker = True
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    cfg.ddp.overlap_param_gather = cfg.optimizer.overlap_param_gather = False
    compat.separate_full_graph_pools(cfg.model)  # else the run fails in its final evaluation


def apply(cfg: Any, plan: FastPathPlan) -> None:
    """Install the plan's pieces on `cfg` (its model provider already has the fast spec when fast_spec is on:
    models/providers.py) and into megatron-core."""
    if plan.on("fast_spec"):
        from kaiyuan_recipes.fastpath.compiled_norm import set_compiled_norm
        from kaiyuan_recipes.fastpath.spec import set_sdpa_backend

        set_sdpa_backend(plan.sdpa_backend)
        set_compiled_norm(plan.on("compiled_norm"))
    if plan.on("swiglu_backward"):
        from kaiyuan_recipes.fastpath.swiglu_backward import register_swiglu_backward

        register_swiglu_backward()
    if plan.on("chunked_loss"):
        from kaiyuan_recipes.fastpath.chunked_loss import install_chunked_loss

        cfg.model.register_pre_wrap_hook(install_chunked_loss)
    if plan.on("foreach_grad_clip"):
        from kaiyuan_recipes.fastpath.apex_standins import foreach_grad_clip

        foreach_grad_clip()
    if plan.on("cuda_graph"):
        _full_step_cuda_graph(cfg)
    if plan.on("wgrad_fusion"):
        from kaiyuan_recipes.fastpath.apex_standins import torch_wgrad_accumulation

        # the plan turned it on only where this is available (decisions.py); the model setting itself is
        # decided in one place, training/config.py's _wgrad_fusion_as_decided (a model.* override wins there)
        torch_wgrad_accumulation()


def callbacks(plan: FastPathPlan) -> list[Any]:
    """The Megatron-Bridge callbacks the plan's pieces need in a training worker."""
    if not plan.on("fused_adamw"):
        return []
    from kaiyuan_recipes.fastpath.fused_adamw import FusedAdamWCallback

    return [FusedAdamWCallback()]
