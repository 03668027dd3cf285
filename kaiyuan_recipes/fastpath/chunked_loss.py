"""Cross-entropy over a large vocabulary without materialising the logits (tensor parallel 1; any layer spec).
GPTModel's output layer hands its input and weight to the loss instead of computing [tokens, vocab]
logits; the loss computes logits, log-sum-exp and the logits' gradient a chunk of tokens at a time in the
forward, and keeps only that gradient (bf16) for the backward. For qwen3_1p7b at micro batch 2 × 4096 that is
2.5 GB; whole logits are 2.5 GB in bf16, 5 GB in fp32 for the softmax and as much again for their gradient, so
with a vocabulary this large the loss, not the layers, sets the step's peak memory.

Installed as a Megatron-Bridge pre-wrap hook (install_chunked_loss); the model's parameters, state dict and
checkpoints are unchanged. Logits are still produced on request (no labels: inference, export checks)."""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
from megatron.core.jit import jit_fuser

log = logging.getLogger(__name__)
CHUNK_BYTES = 1 << 30  # fp32 logits per chunk


def chunk_tokens(vocab: int) -> int:
    return max(256, CHUNK_BYTES // (4 * vocab))


def _lse_and_loss_fp32(x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(x, dim=-1)
    return lse, lse - x.gather(1, labels[:, None])[:, 0]


def _softmax_minus_one_hot(x: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    one_hot = labels[:, None] == torch.arange(x.shape[1], device=x.device)[None, :]
    return torch.exp(x - lse[:, None]) - one_hot.float()


# The compiled kernels, one per use; the two helpers above are inlined into each.
@jit_fuser
def _loss_and_softmax_grad(logits: torch.Tensor, labels: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chunk's fp32 log-sum-exp and loss, and d loss / d logits = softmax - one-hot in the logits' dtype."""
    x = logits.float()
    lse, loss = _lse_and_loss_fp32(x, labels)
    return lse, loss, _softmax_minus_one_hot(x, lse, labels).to(logits.dtype)


@jit_fuser
def _lse_and_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _lse_and_loss_fp32(logits.float(), labels)


@jit_fuser
def _grad_logits(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor,
                 grad_loss: torch.Tensor) -> torch.Tensor:
    """(softmax - one-hot) · dloss per token, in the logits' dtype."""
    return (_softmax_minus_one_hot(logits.float(), lse, labels) * grad_loss[:, None].float()).to(logits.dtype)


def _add_chunk_grads(grad_logits: torch.Tensor, rows: slice, hidden: torch.Tensor, weight: torch.Tensor,
                     grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> None:
    """A chunk's two gradient GEMMs: its rows of d hidden, and its share of d weight, accumulated by the GEMM
    (fp32 inside, one rounding to the weight's dtype per chunk)."""
    if grad_hidden is not None:
        torch.mm(grad_logits, weight, out=grad_hidden[rows])
    if grad_weight is not None:
        grad_weight.addmm_(grad_logits.t(), hidden[rows])


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """loss_i = logsumexp(h_i Wᵀ) - (h_i Wᵀ)[y_i] for hidden [N, h], weight [V, h], labels [N]; fp32 loss.
    Logits are computed in the inputs' dtype and reduced in fp32, as Megatron's unfused path does; a chunk's
    element-wise work is one compiled kernel.

    With `grads_in_forward` the forward also computes each chunk's d loss / d logits for a unit upstream
    gradient, G = softmax - one-hot (kept, in the logits' dtype), and d hidden = G W. The backward weighs them
    by the upstream gradient g exactly, whatever the loss mask did to it: d hidden rows scale by g, and
    d W = Gᵀ (g · h), the weights applied to the small hidden side. Three lm-head GEMMs in all, as with whole
    logits, and nothing read on the host (a CUDA graph replays this unchanged). Without it (no grad needed in
    the forward, or a second backward) the backward recomputes each chunk's logits (a fourth GEMM).
    With `into_main_grad` (kaiyuan.wgrad_fusion) d W accumulates straight into the weight's fp32 main grad."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                grads_in_forward: bool = False, into_main_grad: bool = False) -> torch.Tensor:
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ctx.unit_grads = None
        unit_hidden, unit_logits = (torch.empty_like(hidden), []) if grads_in_forward else (None, None)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            logits = hidden[rows] @ weight.t()
            if not grads_in_forward:
                lse[rows], loss[rows] = _lse_and_loss(logits, labels[rows])
                continue
            lse[rows], loss[rows], grad_logits = _loss_and_softmax_grad(logits, labels[rows])
            torch.mm(grad_logits, weight, out=unit_hidden[rows])
            unit_logits.append(grad_logits)
        if grads_in_forward:
            ctx.unit_grads = unit_hidden, unit_logits
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.chunk, ctx.into_main_grad = chunk, into_main_grad
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        hidden, weight, labels, lse = ctx.saved_tensors
        unit_grads, ctx.unit_grads = ctx.unit_grads, None  # freed here: a second backward recomputes
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if unit_grads is not None:
            unit_hidden, unit_logits = unit_grads
            grad_hidden = (unit_hidden * grad_loss[:, None]).to(hidden.dtype) if want_hidden else None
            accumulate = _main_grad_accumulate(weight) if want_weight and ctx.into_main_grad else None
            grad_weight = torch.zeros_like(weight) if want_weight and accumulate is None else None
            for i, grad_logits in enumerate(unit_logits if want_weight else ()):
                rows = slice(i * ctx.chunk, (i + 1) * ctx.chunk)
                scaled_hidden = (hidden[rows] * grad_loss[rows, None]).to(hidden.dtype)
                if accumulate is None:
                    grad_weight.addmm_(grad_logits.t(), scaled_hidden)
                else:
                    accumulate(scaled_hidden, grad_logits, weight.main_grad)
            if accumulate is not None:  # as megatron-core's fused linear layers: a dummy grad, the flag set;
                # zeros where the embedding shares the weight (its gradient is added to this one by autograd)
                dummy = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
                grad_weight = dummy(weight.main_grad.shape, dtype=hidden.dtype, device=hidden.device)
                weight.grad_added_to_main_grad = True
            return grad_hidden, grad_weight, None, None, None, None
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            grad_logits = _grad_logits(hidden[rows] @ weight.t(), lse[rows], labels[rows], grad_loss[rows])
            _add_chunk_grads(grad_logits, rows, hidden, weight, grad_hidden, grad_weight)
        return grad_hidden, grad_weight, None, None, None, None


def _main_grad_accumulate(weight: torch.Tensor) -> Any:
    """kaiyuan.wgrad_fusion for the output layer: megatron-core's weight-gradient accumulate (Apex's extension or
    apex_standins.torch_wgrad_accumulation) into the DDP main grad, in fp32 across chunks and micro-batches,
    instead of a bf16 weight gradient that DDP's hook then adds; None where the weight has no main grad to take it."""
    from megatron.core.tensor_parallel import layers

    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None or not hasattr(weight, "grad_added_to_main_grad") or not layers._grad_accum_fusion_available:
        return None
    extension = layers.fused_weight_gradient_mlp_cuda
    return extension.wgrad_gemm_accum_fp32 if main_grad.dtype == torch.float32 else extension.wgrad_gemm_accum_fp16


class DeferredLogits:
    """What the patched output layer returns: its input and weight. The loss consumes them chunk by chunk;
    anything else that asks for logits (GPTModel without labels) gets them materialised."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor):
        self.hidden, self.weight = hidden, weight

    def materialize(self) -> torch.Tensor:
        return self.hidden @ self.weight.t()

    def transpose(self, *dims: int) -> torch.Tensor:
        return self.materialize().transpose(*dims)


def _deferred_output(self, input_: torch.Tensor, weight: torch.Tensor | None = None,
                     runtime_gather_output: bool | None = None):
    return DeferredLogits(input_, self.weight if weight is None else weight), None


def _chunked_language_model_loss(self, labels: torch.Tensor, logits: Any) -> torch.Tensor:
    if not isinstance(logits, DeferredLogits):
        return type(self).compute_language_model_loss(self, labels, logits)
    hidden = logits.hidden  # [s, b, h]; labels [b, s]; Megatron's loss is [b, s]
    s, b, h = hidden.shape
    training = torch.is_grad_enabled() and (hidden.requires_grad or logits.weight.requires_grad)
    loss = ChunkedLinearCrossEntropy.apply(hidden.reshape(s * b, h), logits.weight,
                                           labels.transpose(0, 1).reshape(s * b), chunk_tokens(logits.weight.shape[0]),
                                           training, bool(self.config.gradient_accumulation_fusion))
    return loss.view(s, b).transpose(0, 1).contiguous()


def unsupported_config_reason(config: Any) -> str | None:
    """Why a model with this config cannot use the chunked loss, or None (fastpath/decisions.py asks too)."""
    if config.tensor_model_parallel_size != 1 or config.sequence_parallel:
        return "tensor parallel (the output layer is vocab-parallel)"
    if getattr(config, "use_mup", False) or getattr(config, "mtp_num_layers", None):
        return "MuP output scaling or multi-token prediction"
    return None


def unsupported_reason(model: Any) -> str | None:
    """Why the chunked loss cannot replace this model chunk's output layer, or None."""
    layer = getattr(model, "output_layer", None)
    if layer is None or not getattr(model, "post_process", False):
        return "no output layer on this pipeline stage"
    if getattr(layer, "bias", None) is not None:
        return "output layer has a bias"
    return unsupported_config_reason(model.config)


def install_chunked_loss(model: list[Any]) -> list[Any]:
    """Megatron-Bridge pre-wrap hook: patch each eligible GPTModel chunk in place (instance attributes only)."""
    for chunk in model:
        reason = unsupported_reason(chunk)
        if reason:
            log.info("chunked cross-entropy not used: %s", reason)
            continue
        chunk.output_layer.forward = types.MethodType(_deferred_output, chunk.output_layer)
        chunk.compute_language_model_loss = types.MethodType(_chunked_language_model_loss, chunk)
    return model
