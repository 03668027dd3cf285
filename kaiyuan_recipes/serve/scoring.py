"""Teacher-forced scoring of prompt + completion (logprobs, echo): log_softmax of the model's own logits at every
position, in chunks of `chunk` positions that carry the keys and values before them in a cache (a chunked
prefill). One chunk's logits are `chunk` x vocabulary floats whatever the sequence's length, where one forward
over the whole sequence would hold them for every position (a 4,000-token sequence of a 150k vocabulary: 2.4 GB
in fp32, and as much again for its log_softmax); and the engine's worker decodes between two chunks, and stops
between two when it must (a shutdown, a client gone)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SCORE_CHUNK = 256  # positions per forward: ~150 MB of fp32 logits for a 150k vocabulary
FLOOR = -9999.0  # a logprob of -inf in OpenAI's answer (JSON has no infinity)
MEGATRON_FLOOR = -1e9  # the same in Megatron's answer


@dataclass
class ScoringJob:
    """The scores of `ids` (prompt + completion) under way: `top` alternatives per position (None: the chosen
    tokens' logprobs only), computed up to input position `done`."""

    ids: list[int]
    top: int | None
    done: int = 0
    chosen: list[float] = field(default_factory=list)
    alternatives: list[list[tuple[int, float]]] = field(default_factory=list)
    cache: Any = None  # the model's cache of ids[:done]

    @property
    def finished(self) -> bool:
        return self.done >= len(self.ids) - 1  # the last token is scored, never a position to score from

    def megatron_logprobs(self) -> list[float]:
        """Megatron's server's logprobs: log p(token_i | tokens_<i) for i >= 1, non-finite as MEGATRON_FLOOR."""
        return [v if math.isfinite(v) else MEGATRON_FLOOR for v in self.chosen]

    def openai_logprobs(self) -> list[float]:
        return [max(v, FLOOR) if not math.isnan(v) else FLOOR for v in self.chosen]


@torch.inference_mode()
def score_chunk(model: Any, device: str, job: ScoringJob, chunk: int = SCORE_CHUNK) -> None:
    """The next `chunk` positions of job: each position's log_softmax over the vocabulary (fp32), the next token's
    logprob and the `top` likeliest (token, logprob) pairs (-inf floored at FLOOR)."""
    if job.finished:
        return
    end = min(job.done + chunk, len(job.ids) - 1)
    inputs = torch.tensor([job.ids[job.done:end]], device=device)
    out = model(input_ids=inputs, past_key_values=job.cache, use_cache=True)
    job.cache = out.past_key_values
    logp = torch.log_softmax(out.logits[0].float(), -1)
    targets = torch.tensor(job.ids[job.done + 1:end + 1], device=device)
    job.chosen += logp.gather(-1, targets[:, None])[:, 0].tolist()
    if job.top is not None:
        if job.top:
            values, indices = logp.clamp(min=FLOOR).topk(job.top, -1)
            job.alternatives += [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        else:
            job.alternatives += [[] for _ in range(end - job.done)]
    job.done = end
    if job.finished:
        job.cache = None
