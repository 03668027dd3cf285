"""What Apex or Transformer Engine would give a megatron-core run, made of torch's own kernels: the weight-gradient
accumulate into the fp32 main grad (kaiyuan.wgrad_fusion) and gradient clipping through foreach kernels
(kaiyuan.foreach_grad_clip). Each is installed by fastpath.apply when the plan turns it on; megatron-core keeps
its own paths where Apex or TE is present."""

from __future__ import annotations

import types
from typing import Any


def _wgrad_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    """main_grad (fp32) += grad_outputᵀ · total_input: for bf16/fp16 inputs one cuBLAS call accumulating in fp32."""
    import torch

    if total_input.dtype == torch.float32:
        _wgrad_accum_same_dtype(total_input, grad_output, main_grad)
    else:
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)


def _wgrad_accum_same_dtype(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    main_grad.addmm_(grad_output.t(), total_input)


def torch_wgrad_accumulation() -> bool:
    """megatron-core fuses a linear layer's weight-gradient GEMM with the accumulation into the fp32 main grad
    (gradient_accumulation_fusion) only through Apex's fused_weight_gradient_mlp_cuda extension or TE. Without
    them every weight gradient is materialised in bf16 and added to main_grad by a separate kernel (one more
    pass over every weight's gradient in each micro-batch). torch's addmm with out_dtype (CUDA: bf16 inputs, fp32
    output, torch 2.8+) is that accumulate in one call: installed as the extension megatron-core's layers call. For
    kaiyuan.wgrad_fusion; returns whether the layers can fuse now."""
    import torch
    from megatron.core.tensor_parallel import layers

    if layers._grad_accum_fusion_available:
        return True  # Apex's extension, or already installed
    if not hasattr(torch.ops.aten.addmm, "dtype_out"):
        return False
    layers.fused_weight_gradient_mlp_cuda = types.SimpleNamespace(
        wgrad_gemm_accum_fp32=_wgrad_accum_fp32, wgrad_gemm_accum_fp16=_wgrad_accum_same_dtype)
    layers._grad_accum_fusion_available = True
    return True


def _foreach_l2_norm(chunk_size: int, noop_flag: Any, tensor_lists: list, per_tensor: bool, *args: Any) -> Any:
    """amp_C.multi_tensor_l2norm's interface: the norm over every tensor, left on the device."""
    import torch

    if not tensor_lists[0]:
        return torch.zeros(1, dtype=torch.float32, device="cuda"), None  # upstream's fallback: a CUDA zero
    norms = torch.stack(torch._foreach_norm(tensor_lists[0], dtype=torch.float32))
    return torch.linalg.vector_norm(norms).reshape(1), norms if per_tensor else None


def _foreach_scale(chunk_size: int, noop_flag: Any, tensor_lists: list, scale: float) -> None:
    """amp_C.multi_tensor_scale's interface (dst = src * scale) in a few foreach kernels."""
    import torch

    src, dst = tensor_lists
    if all(a is b for a, b in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))


def foreach_grad_clip() -> bool:
    """Without Apex or TE, megatron-core's gradient clipping falls back to megatron.core.utils'
    local_multi_tensor_l2_norm, which turns each parameter's norm into a Python float (one device-to-host sync
    per parameter, 227 a step for qwen3_1p7b), and local_multi_tensor_scale, two kernels per parameter.
    Route both through torch's foreach kernels; megatron-core still reads the total norm once, as with Apex.
    Returns whether ours are in place."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    replacements = {"l2_norm_impl": (utils.local_multi_tensor_l2_norm, _foreach_l2_norm),
                    "multi_tensor_scale_impl": (utils.local_multi_tensor_scale, _foreach_scale)}
    installed = False
    for module in (clip_grads, optimizer):  # each binds the fallbacks it imported under these names
        for name, (local, ours) in replacements.items():
            if getattr(module, name, None) is local:
                setattr(module, name, ours)
            installed = installed or getattr(module, name, None) is ours
    return installed


