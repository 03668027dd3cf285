"""Megatron's `PUT /api` over the engine: the request's cross-field rules (as Megatron's server states them), its
prompts tokenized and checked against the envelope before any model work, one engine request per prompt, and
Megatron's response (the prompt with its continuation, per-token segments and ids, and logprobs when asked)."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import Receive

from ..dispatch import submitted
from ..engine import Completion, GenerationEngine, Request, Sampling
from ..envelope import check_new_tokens, check_prompt
from ..errors import APIError
from .protocol import MegatronGenerate


def requests_for(engine: GenerationEngine, body: MegatronGenerate, sampling: Sampling, limit: int) -> list[Request]:
    """One request per prompt, each within the envelope (a 400 otherwise)."""
    check_new_tokens(body.tokens_to_generate, limit, "tokens_to_generate")
    out = []
    for i, prompt in enumerate(body.prompts):
        ids = engine.encode(prompt)
        where = "prompts" if len(body.prompts) == 1 else f"prompts[{i}]"
        check_prompt(ids, body.tokens_to_generate, engine.max_length, where, "tokens_to_generate", "prompts")
        if sampling.seed is not None:  # prompt i draws with seed + i: equal prompts still differ, as in one batch
            sampling = dataclasses.replace(sampling, seed=(body.random_seed + len(out)) % 2**64)
        out.append(Request(ids, body.tokens_to_generate, sampling, body.logprobs))
    return out


def respond(engine: GenerationEngine, body: MegatronGenerate, results: list[Completion]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": [p + engine.decode(r.token_ids) for p, r in zip(body.prompts, results)],
        "segments": [[engine.decode([t]) for t in r.prompt_ids + r.token_ids] for r in results],
        "tokens": [r.prompt_ids + r.token_ids for r in results],
    }
    if body.logprobs:
        out["logprobs"] = [r.logprobs for r in results]
    return out


async def generate(engine: GenerationEngine, body: MegatronGenerate, limit: int, receive: Receive) -> dict[str, Any]:
    """receive: the HTTP request's (a client that leaves cancels its requests)."""
    if body.tokens_to_generate == 0 and not body.logprobs:
        raise APIError(400, "tokens_to_generate=0 implies logprobs should be True", "logprobs")
    if body.top_k > 0 and body.top_p > 0:
        raise APIError(400, "cannot set both top-k and top-p samplings.", "top_p")
    sampling = Sampling(body.temperature, body.top_k, body.top_p or 1.0, body.random_seed)
    requests = await run_in_threadpool(requests_for, engine, body, sampling, limit)
    results = await submitted(engine, requests, receive)
    return await run_in_threadpool(respond, engine, body, results)
