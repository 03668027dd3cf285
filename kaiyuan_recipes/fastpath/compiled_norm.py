"""The fast spec's RMSNorm: torch.nn.RMSNorm (the module, parameters and state dict the local spec's
WrappedTorchNorm builds) with its forward compiled by megatron-core's jit_fuser (torch.compile): one fused kernel
each way where torch's own kernels spend ~6x the memory-bound time in the weight-gradient reduction (profile:
benchmarks/README.md). `kaiyuan.compiled_norm=false` keeps torch's."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.jit import jit_fuser
from megatron.core.transformer.torch_norm import WrappedTorchNorm

_enabled = True


def set_compiled_norm(enabled: bool) -> None:
    """Process-wide, like the SDPA backend order: set by fastpath.apply from the run's plan."""
    global _enabled
    _enabled = bool(enabled)


@jit_fuser
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # torch's rms_norm for reduced precision: statistics in fp32, normalised input cast back, then the weight
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class CompiledRMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm whose forward (and so backward) runs compiled; shapes it was not built for use torch's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or self.eps is None or self.normalized_shape != (x.shape[-1],):
            return super().forward(x)
        return _rms_norm(x, self.weight, self.eps)


class FastNorm:
    """A layer-spec norm builder with WrappedTorchNorm's interface: CompiledRMSNorm for RMSNorm models (while
    enabled), WrappedTorchNorm's module otherwise."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
        module = WrappedTorchNorm(config, hidden_size, eps, **kwargs)  # keeps its checks (no SP, ...)
        if _enabled and type(module) is torch.nn.RMSNorm:
            module.__class__ = CompiledRMSNorm  # same parameters and buffers; only forward differs
        return module


def with_fast_norms(spec: Any) -> Any:
    """The layer spec (or block spec of layer specs) with its torch norms built by FastNorm."""
    for layer in getattr(spec, "layer_specs", None) or [spec]:
        sub = layer.submodules
        for name in ("input_layernorm", "pre_mlp_layernorm"):
            if getattr(sub, name) is WrappedTorchNorm:
                setattr(sub, name, FastNorm)
        attention = getattr(sub.self_attention, "submodules", None)
        for name in ("q_layernorm", "k_layernorm"):
            if attention is not None and getattr(attention, name, None) is WrappedTorchNorm:
                setattr(attention, name, FastNorm)
    return spec
