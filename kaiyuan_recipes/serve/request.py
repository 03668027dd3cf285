"""What the engine is asked (Request, with its Sampling) and what it answers (Completion, with TokenScores), and
EngineStopped, its refusal or failure when it is shutting down."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable


class EngineStopped(RuntimeError):
    """The engine is shutting down (or failed to start): the request was not finished."""


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy; top_k 0 and top_p 1 mean no filtering."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    logprobs: bool = False  # Megatron's: Completion.logprobs over prompt + completion
    ignore_eos: bool = False  # generate exactly max_new_tokens (benchmarks)
    on_token: Callable[[int], None] | None = None  # streaming: called from the worker thread
    stop: tuple[str, ...] = ()  # the row ends with the token that completes one of these in its text
    top_logprobs: int | None = None  # Completion.scores: every token's logprob and this many alternatives
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    submitted_at: float = 0.0  # time.monotonic() at submit
    call: int = 0  # the submit_all it came with: its turns are that call's (admission.py)

    @property
    def scored(self) -> bool:
        return self.logprobs or self.top_logprobs is not None


@dataclass
class TokenScores:
    """Per token from position 1 of prompt + completion: log p(token | tokens before) and the `top` likeliest
    (token id, logprob) pairs at that position, most likely first."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]  # generated: an end-of-text that ended the row is the last (as vLLM's and Megatron's)
    finish_reason: str  # "stop" (end of text or a stop string) or "length"
    logprobs: list[float] | None = None  # prompt (first token has none) + generated, natural log
    scores: TokenScores | None = None

