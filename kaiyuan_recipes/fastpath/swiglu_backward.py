"""SwiGLU's backward as one Triton kernel that reads the gate, the up projection and the upstream gradient once
and writes both halves of the input gradient. megatron-core's compiled swiglu_back returns the two halves as a
concatenation, and inductor's kernel for it reads the gate half and the upstream gradient twice. The kernel is
bound by memory traffic and runs in every MLP layer's backward, so the reads it repeats are the time it wastes.

Installed into megatron-core's SwiGLUFunction (the fast spec's bias-free SwiGLU, bias_activation_fusion=True) by
register_swiglu_backward when the plan says so (kaiyuan.swiglu_backward); anything the kernel does not cover
(not CUDA, not contiguous, mixed dtypes) goes to megatron-core's own swiglu_back."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _swiglu_back_kernel(g_ptr, y_ptr, dy_ptr, n, BLOCK: tl.constexpr):
    """One row block of d y = [g · σ(a)(1 + a(1 - σ(a))) · b, g · a σ(a)] for y = [a, b], in fp32 like inductor."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(g_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(y_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(y_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    out = dy_ptr.dtype.element_ty
    tl.store(dy_ptr + row * 2 * n + cols, (g * sig * (1 + gate * (1 - sig)) * up).to(out), mask=mask)
    tl.store(dy_ptr + row * 2 * n + n + cols, (g * gate * sig).to(out), mask=mask)


def swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """megatron-core's swiglu_back(g, y) for g [rows, n], y [rows, 2n]."""
    from megatron.core.fusions import fused_bias_swiglu

    if not (g.is_cuda and y.is_cuda and g.dtype == y.dtype and g.dim() == y.dim() == 2
            and g.is_contiguous() and y.is_contiguous() and y.shape == (g.shape[0], 2 * g.shape[1])):
        return fused_bias_swiglu.swiglu_back(g, y)
    rows, n = g.shape
    dy = torch.empty_like(y)
    _swiglu_back_kernel[(rows, triton.cdiv(n, BLOCK))](g, y, dy, n, BLOCK=BLOCK)
    return dy


def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    """megatron-core's SwiGLUFunction.backward with the kernel above."""
    saved = ctx.saved_tensors[0]
    saved = saved.to(ctx.ori_input_dtype) if ctx.fp8_input_store else saved
    return swiglu_back(grad_output, saved), None, None


def register_swiglu_backward() -> bool:
    """Process-wide (megatron-core's autograd function); returns whether it was installed now."""
    from megatron.core.fusions import fused_bias_swiglu

    if fused_bias_swiglu.SwiGLUFunction.backward is _backward:
        return False
    fused_bias_swiglu.SwiGLUFunction.backward = staticmethod(_backward)
    return True
