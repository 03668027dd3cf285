"""The generation engine behind `kaiyuan serve`: a HF causal LM with a KV cache, concurrent requests
batched together. A worker thread drains the request queue, groups requests that share sampling settings,
and runs each group as one left-padded batch through the static-cache decoder (decode.py: compiled,
CUDA-graph-captured steps; sampled with transformers' temperature / top-k / top-p), or through
`model.generate` where there is no static cache (CPU default). New tokens reach streaming callers as they
are produced; a row ends at end-of-text, at max_new_tokens, at one of its stop strings, or when its caller
cancels it (a client gone), and the batch stops when every row has ended. Log-probabilities (with the top
alternatives) come from one teacher-forced forward pass over prompt + completion: log_softmax of the logits."""

from __future__ import annotations

import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .decode import Sampler, StaticDecoder, left_pad


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
    # Sampled requests with a seed run only with rows of the same group (one HTTP request), so that the seed
    # gives the same completion whoever else is being served.
    group: object = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)


@dataclass
class TokenScores:
    """Per token from position 1 of prompt + completion: log p(token | tokens before) and the `top` likeliest
    (token id, logprob) pairs at that position, most likely first."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" (end of text or a stop string) or "length"
    logprobs: list[float] | None = None  # prompt (first token has none) + generated, natural log
    scores: TokenScores | None = None


def find_stop(text: str, stops: tuple[str, ...] | list[str]) -> int | None:
    """Where the first of `stops` begins in text (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class _RowStreamer:
    """Routes each row's new token to its request: transformers' streamer protocol (put/end) for generate(),
    push for the static-cache decoder's columns."""

    def __init__(self, requests: list[Request], eos: set[int], decode: Callable[[list[int]], str]):
        self.requests, self.eos, self.decode = requests, eos, decode
        self.first = True
        self.done = [False] * len(requests)
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.stopped: list[int | None] = [None] * len(requests)  # tokens up to the one completing a stop string
        self.cancelled = 0  # rows ended because their caller cancelled them
        # a stop string's characters lie within this many last tokens (a character is at most 4 byte tokens)
        self.window = [4 * max(map(len, r.stop)) + 4 if r.stop else 0 for r in requests]

    def put(self, value: torch.Tensor) -> None:
        if self.first:  # generate() first hands over the prompt
            self.first = False
            return
        self.push(value.reshape(-1).tolist())

    def push(self, column: list[int] | tuple[int, ...]) -> bool:
        """One new token per row; True when every row has ended."""
        for row, token in enumerate(column):
            req = self.requests[row]
            if self.done[row]:
                continue
            if req.cancelled.is_set() or token in self.eos or len(self.tokens[row]) >= req.max_new_tokens:
                self.done[row] = True
                self.cancelled += req.cancelled.is_set()
                continue
            self.tokens[row].append(token)
            if req.on_token is not None:
                req.on_token(token)
            if req.stop and find_stop(self.decode(self.tokens[row][-self.window[row]:]), req.stop) is not None:
                self.done[row] = True
                self.stopped[row] = len(self.tokens[row])
        return all(self.done)

    def end(self) -> None:
        pass

    def stopping_criteria(self) -> Any:
        """For generate(): a row is finished once this streamer has ended it."""
        from transformers import StoppingCriteria

        streamer = self

        class Ended(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
                return torch.tensor(streamer.done, dtype=torch.bool, device=input_ids.device)

        return Ended()


class GenerationEngine:
    def __init__(self, model_dir: Path, device: str | None = None, max_batch_size: int = 32,
                 max_length: int | None = None, batch_window_s: float = 0.005, static_cache: bool | None = None,
                 decode_mode: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(self.device).eval()
        self.max_length = max_length or int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        # A static cache is what makes decoding fast (compiled, CUDA graphs); on CPU it only costs memory.
        self.static_cache = self.device.startswith("cuda") if static_cache is None else static_cache
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos or {0})
        self.decoder = StaticDecoder(self.model, self.device, decode_mode, self.max_length, self.pad_id)
        self._queue: queue.Queue[Request] = queue.Queue()
        self._worker = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._worker.start()
        # new tokens generated, and rows ended early because their caller left (a stream's client gone)
        self.stats = {"batches": 0, "requests": 0, "max_batch": 0, "tokens": 0, "cancelled": 0}

    # -- public -------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (a piece of a multi-byte character shows as U+FFFD)."""
        return self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)

    def submit(self, request: Request) -> Future:
        if len(request.prompt_ids) + request.max_new_tokens > self.max_length:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + tokens_to_generate "
                             f"({request.max_new_tokens}) exceeds the model's {self.max_length} positions")
        self._queue.put(request)
        return request.future

    def generate(self, requests: list[Request]) -> list[Completion]:
        """Run `requests` as one batch in the calling thread (benchmarks, tests)."""
        return self._run(requests)

    # -- worker -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            pending = [first]
            deadline = time.monotonic() + self.batch_window_s
            while len(pending) < self.max_batch_size:
                try:
                    pending.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            for req in [r for r in pending if r.cancelled.is_set()]:  # its client left while it queued
                req.future.cancel()
            pending = [r for r in pending if not r.cancelled.is_set()]
            groups: dict[tuple, list[Request]] = {}
            for req in pending:
                seeded = req.sampling.seed is not None and not req.sampling.greedy
                key = (req.sampling, req.ignore_eos, req.group if seeded else None)
                groups.setdefault(key, []).append(req)
            for group in groups.values():
                try:
                    results = self._run(group)
                except Exception as err:  # noqa: BLE001  (delivered to every waiting caller)
                    for req in group:
                        req.future.set_exception(err)
                    continue
                for req, res in zip(group, results):
                    req.future.set_result(res)

    def _decode_static(self, requests: list[Request], sampling: Sampling,
                       streamer: _RowStreamer | None) -> list[list[int]]:
        new = max(r.max_new_tokens for r in requests)
        stop_early = not all(r.ignore_eos for r in requests)
        on_tokens = self._stream_columns(streamer) if streamer is not None else None
        sampler = None if sampling.greedy else Sampler(sampling.temperature, sampling.top_k, sampling.top_p)
        return self.decoder.decode([r.prompt_ids for r in requests], new, self.eos, stop_early, on_tokens,
                                   sampler).tolist()

    @staticmethod
    def _stream_columns(streamer: _RowStreamer) -> Callable[[list[list[int]]], bool]:
        """The decoder's callback (new tokens, a list per row) feeding the streamer; True stops decoding."""

        def on_tokens(rows: list[list[int]]) -> bool:
            return any([streamer.push(column) for column in zip(*rows)])

        return on_tokens

    def _generate_padded(self, requests: list[Request], sampling: Sampling, new_tokens: int,
                         streamer: _RowStreamer | None) -> list[list[int]]:
        """Any batch: left-padded through transformers' generate (static cache on CUDA), streamed if asked."""
        ids, mask = left_pad([r.prompt_ids for r in requests], self.pad_id)
        width = ids.shape[1]
        kwargs: dict[str, Any] = dict(max_new_tokens=new_tokens, pad_token_id=self.pad_id,
                                      do_sample=not sampling.greedy)
        if all(r.ignore_eos for r in requests):
            kwargs["min_new_tokens"] = new_tokens
        if not sampling.greedy:
            kwargs |= dict(temperature=sampling.temperature, top_k=sampling.top_k or None,
                           top_p=sampling.top_p if sampling.top_p < 1 else None)
        if self.static_cache:
            kwargs["cache_implementation"] = "static"
        if streamer is not None:
            kwargs["stopping_criteria"] = [streamer.stopping_criteria()]
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      streamer=streamer, **kwargs)
        return out[:, width:].tolist()

    def _run(self, requests: list[Request]) -> list[Completion]:
        sampling = requests[0].sampling
        new_tokens = max(r.max_new_tokens for r in requests)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        watched = any(r.on_token or r.stop for r in requests) or any(r.cancelled.is_set() for r in requests)
        streamer = _RowStreamer(requests, self.eos, self.decode) if watched else None
        if new_tokens == 0:
            generated = [[] for _ in requests]
        elif self.static_cache:
            generated = self._decode_static(requests, sampling, streamer)
        else:
            generated = self._generate_padded(requests, sampling, new_tokens, streamer)
        self.stats["batches"] += 1
        self.stats["requests"] += len(requests)
        self.stats["max_batch"] = max(self.stats["max_batch"], len(requests))
        self.stats["tokens"] += sum(len(row) for row in generated)
        self.stats["cancelled"] += streamer.cancelled if streamer is not None else 0
        completions = []
        for index, (req, row) in enumerate(zip(requests, generated)):
            row = row[: req.max_new_tokens]
            stop = None if req.ignore_eos else next((i for i, t in enumerate(row) if t in self.eos), None)
            if streamer is not None and streamer.stopped[index] is not None:
                stop = min(streamer.stopped[index], len(row) if stop is None else stop)
            tokens = row[:stop] if stop is not None else row
            completions.append(Completion(req.prompt_ids, tokens, "stop" if stop is not None else "length"))
        for req, comp in zip(requests, completions):
            if req.logprobs:
                comp.logprobs = self.sequence_logprobs(comp.prompt_ids + comp.token_ids)
            if req.top_logprobs is not None:
                comp.scores = self.token_scores(comp.prompt_ids + comp.token_ids, req.top_logprobs)
        return completions

    def token_scores(self, ids: list[int], top: int) -> TokenScores:
        """TokenScores of `ids` (the model's log_softmax over the vocabulary, fp32; -inf reported as -9999)."""
        if len(ids) < 2:
            return TokenScores([], [])
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).clamp(min=-9999.0)
            chosen = logp.gather(-1, torch.tensor(ids[1:], device=self.device)[:, None])[:, 0].tolist()
            values, indices = logp.topk(top, -1) if top else (logp[:, :0], logp[:, :0].long())
        return TokenScores(chosen, [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())])

    def sequence_logprobs(self, ids: list[int]) -> list[float]:
        """log p(token_i | tokens_<i) for i >= 1 under the model (Megatron's server reports these)."""
        if len(ids) < 2:
            return []
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0, :-1].float()
        picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:], device=self.device)[:, None])
        return [v if math.isfinite(v) else -1e9 for v in picked[:, 0].tolist()]
