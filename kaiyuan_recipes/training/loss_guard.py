"""Stops a run on a non-finite training loss when Megatron's own check is off.

Megatron reads every micro-batch's loss on the host and raises on NaN / Inf
(rerun_state_machine.check_for_nan_in_loss). A whole-step CUDA graph (kaiyuan.cuda_graph) cannot read
anything on the host mid-step, so Megatron-Bridge requires that check off there; this callback reads the
step's reduced loss once, after the step and before Megatron would save that iteration's checkpoint, so
a diverged model is never written."""

from __future__ import annotations

import math
from typing import Any

from kaiyuan_recipes.compat.bridge_api import Callback


class NonFiniteLossError(RuntimeError):
    pass


class NonFiniteLossCallback(Callback):
    def on_train_step_end(self, context: Any) -> None:
        if not context.loss_dict:  # not the last pipeline stage: it has no loss
            return
        for name, value in context.loss_dict.items():
            loss = float(value.item() if hasattr(value, "item") else value)
            if not math.isfinite(loss):
                iteration = context.state.train_state.step + 1  # the number Megatron's log and checkpoints use
                raise NonFiniteLossError(
                    f"{name} is {loss} at iteration {iteration}: the run stops before saving this iteration's "
                    "checkpoint (resume continues from the last one; a lower optimizer.lr or a different "
                    "data order usually gets past a divergence)")
