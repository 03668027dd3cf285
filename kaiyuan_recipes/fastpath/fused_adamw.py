"""A fused optimizer step for the fast path (no Transformer Engine / Apex). Megatron then steps
torch.optim.AdamW with its default multi-tensor (foreach) kernels; PyTorch's fused AdamW does the whole
update — moments, bias correction, weight decay, parameter — in one kernel per device and dtype.
Megatron-Bridge builds the optimizer itself, so the switch happens per param group once it is built and
its checkpoint loaded (a Megatron-Bridge callback, on_train_start)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from kaiyuan_recipes.compat.bridge_api import Callback

log = logging.getLogger(__name__)
FUSABLE = (torch.optim.Adam, torch.optim.AdamW)


def inner_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer (chained for MoE: dense and expert)."""
    wrappers = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [w.optimizer for w in wrappers if isinstance(getattr(w, "optimizer", None), torch.optim.Optimizer)]


def fuse_adamw(optimizer: Any) -> int:
    """Switch every eligible param group of the torch Adam/AdamW inside `optimizer` to the fused kernel;
    returns how many groups were switched. Step counters move to the parameters' device (the fused kernel
    reads them there), one tensor per parameter."""
    devices = set(_get_fused_kernels_supported_devices())
    switched = 0
    for inner in inner_optimizers(optimizer):
        if type(inner) not in FUSABLE:
            continue
        for group in inner.param_groups:
            params = group["params"]
            if group.get("fused") or group.get("differentiable") or not params:
                continue
            if any(p.device.type not in devices or not torch.is_floating_point(p) or isinstance(p, DTensor)
                   for p in params):
                continue  # Megatron-FSDP (ZeRO 2) shards into DTensors: left to upstream's step
            group["fused"], group["foreach"] = True, False
            for p in params:
                state = inner.state.get(p)
                if state and "step" in state:
                    state["step"] = state["step"].to(device=p.device, dtype=torch.float32, copy=True)
            switched += 1
    return switched


class FusedAdamWCallback(Callback):
    def on_train_start(self, context: Any) -> None:
        groups = fuse_adamw(context.optimizer)
        log.debug("fused AdamW step in %d param group(s)", groups)
