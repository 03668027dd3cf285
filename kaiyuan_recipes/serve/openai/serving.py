"""OpenAI's `POST /v1/completions` over the engine: prompts (text or token ids) checked against the envelope
before any model work, stop strings cut from the text (never returned; a stream holds back what could
still become one), logprobs with the top alternatives, echo (the prompt, its first token's logprob null),
n choices per prompt, usage. Tokenizing and detokenizing whole texts run off the event loop. A request is
queued before its answer starts (a full engine is a 429, a stopping one a 503, streamed or not), and a
client that leaves cancels its requests, streamed or not."""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Receive

from ..dispatch import submit, submitted
from ..engine import Completion, EngineStopped, GenerationEngine, Request, Sampling
from ..envelope import MAX_PROMPTS, check_new_tokens, check_prompt
from ..errors import APIError, error_body
from ..stops import StopText, cut_at_stop
from .protocol import CompletionLogprobs, CompletionRequest, CompletionResponse, Usage

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what echo returns: the prompt as sent, or its token ids decoded


def prepare(engine: GenerationEngine, body: CompletionRequest, max_tokens: int) -> list[Prompt]:
    """The prompts as token ids, each within the model's positions with max_tokens (a 400 otherwise)."""
    check_new_tokens(body.max_tokens, max_tokens, "max_tokens")
    prompts = body.prompts
    if len(prompts) * body.n > MAX_PROMPTS:
        raise APIError(400, f"{len(prompts)} prompts x n={body.n}: at most {MAX_PROMPTS} completions a request", "n")
    out = []
    for i, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(prompt, str):
            ids, text = engine.encode(prompt), prompt
        else:
            if max(prompt) >= engine.vocab_size:
                raise APIError(400, f"{where}: token id {max(prompt)} outside the vocabulary "
                                    f"(0 to {engine.vocab_size - 1})", "prompt")
            ids, text = list(prompt), engine.tokenizer.decode(prompt)
        check_prompt(ids, body.max_tokens, engine.max_length, where, "max_tokens", "prompt")
        out.append(Prompt(ids, text))
    return out


def requests_for(body: CompletionRequest, prompts: list[Prompt]) -> list[Request]:
    """n rows per prompt; with a seed, the n choices of one prompt differ (seed, seed + 1, ...), as each
    choice alone with its own seed would give."""
    def sampling(choice: int) -> Sampling:
        seed = None if body.seed is None else (body.seed + choice) % 2**64
        return Sampling(body.temperature, body.top_k, body.top_p, seed)

    return [Request(p.ids, body.max_tokens, sampling(c), stop=body.stops, top_logprobs=body.logprobs)
            for p in prompts for c in range(body.n)]


def completion_text(engine: GenerationEngine, result: Completion, stops: tuple[str, ...]) -> tuple[str, str]:
    """The generated text cut before the first stop string, and the finish reason."""
    text = engine.decode(result.token_ids)
    cut = cut_at_stop(text, stops)
    return (text, result.finish_reason) if cut is None else (cut, "stop")


def logprobs_of(engine: GenerationEngine, prompt: Prompt, result: Completion, echo: bool,
                start: int) -> CompletionLogprobs:
    scores = result.scores
    assert scores is not None
    first = len(prompt.ids) - 1  # scores start at the prompt's second token
    ids = (prompt.ids if echo else []) + result.token_ids
    chosen: list[float | None] = ([None] + scores.logprobs) if echo else scores.logprobs[first:]
    top_ids = ([None] + scores.top) if echo else scores.top[first:]
    texts = engine.token_texts(ids)
    alternatives = sorted({i for pairs in top_ids if pairs for i, _ in pairs})
    names = dict(zip(alternatives, engine.token_texts(alternatives)))
    top: list[dict[str, float] | None] = []
    for pairs in top_ids:
        if pairs is None:
            top.append(None)
            continue
        entry: dict[str, float] = {}
        for token, value in pairs:
            entry.setdefault(names[token], value)  # two ids of one text: the likelier one's
        top.append(entry)
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    return CompletionLogprobs(tokens=texts, token_logprobs=chosen, top_logprobs=top, text_offset=offsets)


def respond(engine: GenerationEngine, body: CompletionRequest, prompts: list[Prompt], results: list[Completion],
            cid: str, created: int, model: str) -> dict:
    choices = []
    for index, result in enumerate(results):
        prompt = prompts[index // body.n]
        text, finish = completion_text(engine, result, body.stops)
        logprobs = None
        if body.logprobs is not None:
            logprobs = logprobs_of(engine, prompt, result, body.echo, 0 if body.echo else len(prompt.text))
        choices.append({"index": index, "text": prompt.text + text if body.echo else text,
                        "logprobs": logprobs, "finish_reason": finish})
    return CompletionResponse(id=cid, created=created, model=model, choices=choices,
                              usage=usage(prompts, results)).model_dump()


def usage(prompts: list[Prompt], results: list[Completion]) -> Usage:
    used = sum(len(p.ids) for p in prompts), sum(len(r.token_ids) for r in results)
    return Usage(prompt_tokens=used[0], completion_tokens=used[1], total_tokens=sum(used))


class EngineStream(StreamingResponse):
    """An event stream whose requests are cancelled the moment it ends for any reason (a client gone
    included): the engine drops their rows at its next step."""

    def __init__(self, content: AsyncIterator[str], requests: list[Request]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.requests = requests

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001  (ASGI)
        try:
            await super().__call__(scope, receive, send)
        finally:
            for req in self.requests:
                req.cancelled.set()


class _Arrivals:
    """New tokens from the engine's worker thread to one stream: the worker appends (a deque's append is
    thread-safe) and wakes the event loop only when the stream is not already due to wake, so a stream that
    lags takes every token since its last turn at once, not one event-loop callback per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.wake = loop, asyncio.Event()
        self.tokens: collections.deque[tuple[int, int]] = collections.deque()
        self.due = False  # a wake-up is on its way to the loop

    def put(self, index: int, token: int) -> None:  # the worker thread
        self.tokens.append((index, token))
        if not self.due:
            self.due = True
            self.loop.call_soon_threadsafe(self.wake.set)

    async def wait(self) -> None:
        """Until a token arrives (or the engine is done with the stream's requests: `wake` set)."""
        await self.wake.wait()
        self.wake.clear()
        self.due = False  # before take(): a token appended from here on wakes the loop again

    def take(self) -> list[tuple[int, int]]:
        return [self.tokens.popleft() for _ in range(len(self.tokens))]  # bounded: what is there now


@dataclass
class Submitted:
    """A stream's requests, queued: their futures, and the tokens arriving from the engine's worker."""

    requests: list[Request]
    futures: list[Future]
    arrivals: _Arrivals


def start_stream(engine: GenerationEngine, requests: list[Request]) -> Submitted:
    """Queue a stream's requests (in the event loop), each new token to arrive as (request index, token)."""
    arrivals = _Arrivals(asyncio.get_running_loop())
    for index, req in enumerate(requests):
        req.on_token = functools.partial(arrivals.put, index)
    return Submitted(requests, submit(engine, requests), arrivals)


async def stream(engine: GenerationEngine, body: CompletionRequest, prompts: list[Prompt], submitted_: Submitted,
                 cid: str, created: int, model: str) -> AsyncIterator[str]:
    def event(choices: list[dict], usage_: Usage | None = None) -> str:
        data = CompletionResponse(id=cid, created=created, model=model, choices=choices, usage=usage_)
        return "data: " + data.model_dump_json() + "\n\n"

    requests, arrivals = submitted_.requests, submitted_.arrivals
    try:
        done = asyncio.gather(*map(asyncio.wrap_future, submitted_.futures))
        done.add_done_callback(lambda _: arrivals.wake.set())
        # a stream whose client left never awaits it: its error (the rows' cancellation) is read here, not logged
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        rows = [StopText(engine.decode, body.stops) for _ in requests]  # each new character read once
        texts, sent, ended = ["" for _ in requests], [0] * len(requests), [False] * len(requests)
        if body.echo:
            yield event([{"index": i, "text": prompts[i // body.n].text, "finish_reason": None}
                         for i in range(len(requests))])
        while True:  # bounded: ends when the engine has finished (or failed) every request
            finished = done.done()  # before taking the tokens: every token comes before its request's end
            if not finished:
                await arrivals.wait()
            changed = set()
            for index, token in arrivals.take():
                if not ended[index]:
                    texts[index] += rows[index].add(token)
                    ended[index] = rows[index].found is not None
                    changed.add(index)
            for index in sorted(changed):  # every token since the last wake-up in one event per row
                cut = rows[index].found
                upto = cut if cut is not None else len(texts[index]) - rows[index].held_back()
                if upto > sent[index]:
                    yield event([{"index": index, "text": texts[index][sent[index]:upto], "finish_reason": None}])
                    sent[index] = upto
            if finished:
                break
        results = await done
        final = await run_in_threadpool(lambda: [completion_text(engine, r, body.stops) for r in results])
        for index, (text, finish) in enumerate(final):
            yield event([{"index": index, "text": text[sent[index]:], "finish_reason": finish}])
        if body.stream_options is not None and body.stream_options.include_usage:
            yield event([], usage(prompts, results))
        yield "data: [DONE]\n\n"
    except EngineStopped as err:  # shutting down: the stream ends with that error event
        yield "data: " + json.dumps(error_body(503, str(err), code="shutting_down")) + "\n\n"
    except Exception as err:  # noqa: BLE001  (headers are sent: the stream ends with an error event)
        log.exception("generation failed inside a stream: %s", err)
        yield "data: " + json.dumps(error_body(500, "generation failed (see the server log)")) + "\n\n"


async def complete(engine: GenerationEngine, body: CompletionRequest, model: str, max_tokens: int,
                   receive: Receive) -> dict | EngineStream:
    """receive: the HTTP request's (a client that leaves cancels its requests)."""
    if body.model not in (None, model):
        raise APIError(404, f"model {body.model!r} is not served here (GET /v1/models: {model!r})", "model",
                       "model_not_found")
    prompts = await run_in_threadpool(prepare, engine, body, max_tokens)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    requests = requests_for(body, prompts)
    if body.stream:
        queued = start_stream(engine, requests)
        return EngineStream(stream(engine, body, prompts, queued, cid, created, model), requests)
    results = await submitted(engine, requests, receive)
    return await run_in_threadpool(respond, engine, body, prompts, results, cid, created, model)
