"""Continuation log-probabilities on the Megatron model being trained: its own forward, in its training precision,
on its own weights (no export, no copy).

Each encoded pair (kaiyuan_recipes.data.heldout_scoring.Encoded) becomes one row: tokens ids[:-1], labels ids[1:],
right-padded. The model is called with labels, so it returns the per-token cross-entropy itself, through whatever
loss the run installed: megatron-core's vocab-parallel cross-entropy under tensor parallelism (the logits stay
split over the TP ranks), kaiyuan's chunked loss (fastpath/chunked_loss.py: the logits are never materialised
whole), or the plain one. A pair's log-probability is minus the sum of that loss over its continuation tokens.

The output layer runs in fp32 for these forwards (fp32_output_layer): a bf16 model's logits would otherwise be
rounded to bf16 before the softmax, half a unit in the last place (0.03 nats at a logit of 10, 1 at 300) on the
target's logit and on the log-sum-exp, noise as large as a short completion's NLL differences allow. Its input
(the final norm's output) and weight are upcast, the rest of the model stays in the training precision; training
steps never pass here.

Batches hold pairs of similar length (longest first), padded to a multiple of 64 tokens so a handful of shapes
recur, and at most a training micro-batch's tokens (micro_batch_size × seq_length): the forward's activations stay
within what training already holds. Batches are dealt round-robin over the data-parallel ranks; every rank runs
the same number of forwards (a rank out of batches repeats one and drops its result), since Megatron-FSDP's
parameter gathers and MoE's expert all-to-all are collectives over data-parallel ranks. The sums are all-reduced
over the data-parallel group, so every rank ends with every pair's figure."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from kaiyuan_recipes.data.heldout_scoring import Encoded

WIDTH_MULTIPLE = 64


def padded_width(n_tokens: int, multiple: int, limit: int) -> int:
    return min(limit, math.ceil(n_tokens / multiple) * multiple)


def plan_batches(encoded: Sequence[Encoded], token_budget: int, max_width: int,
                 multiple: int = WIDTH_MULTIPLE) -> list[tuple[list[int], int]]:
    """(pair indices, padded width) per batch, longest pairs first; rows × width ≤ token_budget (one row at least)."""
    order = sorted(range(len(encoded)), key=lambda i: (-len(encoded[i].ids), i))
    batches: list[tuple[list[int], int]] = []
    for i in order:
        n_input = len(encoded[i].ids) - 1
        if batches and (len(batches[-1][0]) + 1) * batches[-1][1] <= token_budget:
            batches[-1][0].append(i)
        else:
            batches.append(([i], padded_width(n_input, multiple, max_width)))
    return batches


def batch_tensors(encoded: Sequence[Encoded], idx: Sequence[int], width: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens, labels, scored (the continuation's label positions) and padding ([rows, width] each)."""
    tokens = torch.zeros((len(idx), width), dtype=torch.long)
    labels = torch.zeros((len(idx), width), dtype=torch.long)
    scored = torch.zeros((len(idx), width), dtype=torch.bool)
    padding = torch.ones((len(idx), width), dtype=torch.bool)
    for row, i in enumerate(idx):
        ids, n = encoded[i].ids, len(encoded[i].ids) - 1
        tokens[row, :n] = torch.tensor(ids[:-1])
        labels[row, :n] = torch.tensor(ids[1:])
        scored[row, n - encoded[i].n_scored:n] = True
        padding[row, :n] = False
    return tokens.to(device), labels.to(device), scored.to(device), padding.to(device)


@contextlib.contextmanager
def fp32_output_layer(chunk: Any) -> Iterator[None]:
    """The chunk's output layer computing fp32 logits from its upcast input and weight (the weight GPTModel passes
    in when embeddings are tied, or its own), whatever forward it has: megatron-core's ColumnParallelLinear (its
    vocab-parallel shard under tensor parallelism, then the vocab-parallel cross-entropy on fp32 logits) or the
    chunked loss's deferral (which then computes each chunk's logits in fp32). Nothing changes on a pipeline stage
    without an output layer or for one with a bias."""
    holder = chunk
    while not hasattr(holder, "output_layer") and hasattr(holder, "module"):  # DDP / Float16Module wrappers
        holder = holder.module
    layer = getattr(holder, "output_layer", None)
    if layer is None or getattr(layer, "bias", None) is not None:
        yield
        return
    own = "forward" in vars(layer)  # an instance forward (the chunked loss's) is put back as it was
    inner, previous = layer.forward, vars(layer).get("forward")

    def forward(input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: bool | None = None):
        weight = layer.weight if weight is None else weight
        return inner(input_.float(), weight=weight.float(), runtime_gather_output=runtime_gather_output)

    layer.forward = forward
    try:
        yield
    finally:
        if own:
            layer.forward = previous
        else:
            del layer.forward


def batch_logprob_sums(model: Any, encoded: Sequence[Encoded], idx: Sequence[int], width: int,
                       moe: bool) -> torch.Tensor:
    """Each pair's summed continuation log-probability (float64), from the model's per-token loss."""
    device = next(model.parameters()).device
    tokens, labels, scored, padding = batch_tensors(encoded, idx, width, device)
    position_ids = torch.arange(width, device=device).expand(len(idx), width)
    # MoE: padding tokens kept out of routing, so they take no expert capacity from the sample's own tokens
    extra = {"padding_mask": padding} if moe else {}
    with fp32_output_layer(model):
        loss = model(tokens, position_ids, None, labels=labels, **extra)  # [rows, width], fp32
    return -(loss.double() * scored).sum(dim=1)


def data_parallel() -> tuple[int, int, Any]:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1, None
    return (parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size(),
            parallel_state.get_data_parallel_group())


def score_encoded(model: Sequence[Any], encoded: Sequence[Encoded], token_budget: int, max_width: int,
                  moe: bool = False, should_stop: Callable[[], bool] | None = None,
                  stop_every: int = 16) -> list[float] | None:
    """Every pair's summed continuation log-probability, on every rank; None when `should_stop` (a collective,
    asked every `stop_every` rounds on all ranks alike) says a stop was requested. Call in eval mode, without
    gradients; `model` is the run's list of model chunks (one: no pipeline parallelism)."""
    (chunk,) = model
    dp_rank, dp_size, dp_group = data_parallel()
    batches = plan_batches(encoded, token_budget, max_width)
    mine = batches[dp_rank::dp_size]
    rounds = math.ceil(len(batches) / dp_size)
    device = next(chunk.parameters()).device
    sums = torch.zeros(len(encoded), dtype=torch.float64, device=device)
    for r in range(rounds):
        if should_stop is not None and r % stop_every == 0 and should_stop():
            return None
        if r < len(mine):
            idx, width = mine[r]
            sums[torch.tensor(idx, device=device)] = batch_logprob_sums(chunk, encoded, idx, width, moe)
        else:  # this rank's share ran out: the same collectives as the others, the result dropped
            batch_logprob_sums(chunk, encoded, *batches[0], moe)
    if dp_size > 1:
        torch.distributed.all_reduce(sums, group=dp_group)
    return sums.tolist()
