"""The fast path: what a run on a host without Transformer Engine uses instead of TE's kernels.

plan(cfg, knobs) decides every piece on or off with its reason (decisions.py), apply(cfg, plan) installs them
(install.py), callbacks(plan) gives the training worker's callbacks; build_config calls the three in that order.
The pieces: spec.py (the fast layer spec: SDPA attention, compiled RoPE, TE-free fusions), compiled_norm.py,
swiglu_backward.py, grouped_experts.py, chunked_loss.py, fused_adamw.py and apex_standins.py (what Apex would give
megatron-core). loading.py: what any process needs to read a fast-spec checkpoint's config."""

from kaiyuan_recipes.fastpath.decisions import FastPathPlan, Piece, plan
from kaiyuan_recipes.fastpath.install import TRAINING_STEP_MODEL_FIELDS, apply, callbacks
from kaiyuan_recipes.fastpath.loading import prepare_megatron_bridge

__all__ = ["TRAINING_STEP_MODEL_FIELDS", "FastPathPlan", "Piece", "apply", "callbacks", "plan",
           "prepare_megatron_bridge"]
