"""The generation engine behind `kaiyuan serve`: a HF causal LM decoding every request in one continuously
batched decode state (batch_decoder.py). A worker thread admits queued requests into free rows at every step
(their prompts prefilled, eagerly), runs one decode step for all rows (a CUDA graph captured at start-up, on
CUDA), and retires rows as they end: at end-of-text, at max_new_tokens, at one of their stop strings, or
when their caller cancels them (a client gone). Each row samples with its own temperature / top-k / top-p
and seed (sampling.py), greedy rows take the argmax. New tokens reach streaming callers as they are
produced. Log-probabilities (with the top alternatives) come from one teacher-forced forward pass over
prompt + completion: log_softmax of the logits. `drain(seconds)` lets in-flight requests finish, then fails
what is left with EngineStopped."""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import attention
from .batch_decoder import BatchDecoder, Envelope, WarmUp
from .sampling import seed_key

log = logging.getLogger(__name__)
DEFAULT_MAX_SEQ_LEN = 4096  # the envelope's positions when neither the model nor --max-seq-len says fewer
IDLE_WAIT_S = 0.05  # with no row decoding, the worker waits this long for a request, then looks again


@dataclass(frozen=True)
class JoinPolicy:
    """When waiting requests join the running batch. Each join is one eager prefill, which stalls every
    decoding row for its duration, so joins are gathered: they happen when at least `min_rows` requests
    wait (or fill every free row), when the oldest has waited `max_wait_s`, or at once when no row decodes.
    min_rows 0: an eighth of the rows (at least 1)."""

    min_rows: int = 0
    max_wait_s: float = 0.25

    def rows_for(self, max_batch: int) -> int:
        return self.min_rows or max(1, max_batch // 8)


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


def find_stop(text: str, stops: tuple[str, ...] | list[str]) -> int | None:
    """Where the first of `stops` begins in text (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


@dataclass
class _Row:
    """A request decoding in one row of the batch."""

    request: Request
    window: int  # a stop string's characters lie within this many last tokens (<= 4 byte tokens a character)
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None  # "stop", "length" or "cancelled" once ended


def _fail(request: Request, error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)


class GenerationEngine:
    def __init__(self, model_dir: Path, device: str | None = None, envelope: Envelope | None = None,
                 dtype: torch.dtype | None = None, join: JoinPolicy = JoinPolicy()):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = self.device.startswith("cuda")
        dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # SDPA (attention.py: a decode step's grouped-query heads without copying the keys and values): the
        # decoder's masks are its boolean 4D masks, and the prefill SDPA's causal path
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                          attn_implementation=attention.register()
                                                          ).to(self.device).eval()
        positions = int(getattr(self.model.config, "max_position_embeddings", DEFAULT_MAX_SEQ_LEN))
        self.envelope = envelope or Envelope(max_seq_len=min(positions, DEFAULT_MAX_SEQ_LEN), capture=cuda)
        if self.envelope.max_seq_len > positions:
            raise ValueError(f"--max-seq-len {self.envelope.max_seq_len}: the model has {positions} positions")
        self.max_length = self.envelope.max_seq_len
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.decoder = BatchDecoder(self.model, self.envelope, self.device)
        self.ready = threading.Event()  # set once warm-up is done: /health says ready from then on
        self.warmup: WarmUp | None = None
        self.failure: BaseException | None = None  # warm-up failed: nothing is served
        self._drain_deadline: float | None = None
        self._stop = threading.Event()
        self.join = join
        self._queue: queue.Queue[Request] = queue.Queue()
        self._intake = threading.Lock()  # held while a submit_all queues its requests, and while _admit takes them
        self._waiting: collections.deque[Request] = collections.deque()  # taken off the queue, not yet joined
        self._rng = random.Random()  # noise keys of unseeded sampled rows
        # rows admitted, most rows in one step, new tokens, rows ended because their caller left (a client gone);
        # seconds in decode steps (each until its tokens reach the host) and in prefills: with the wall time, where
        # a loaded server's time goes
        self.stats = {"requests": 0, "steps": 0, "max_batch": 0, "tokens": 0, "cancelled": 0, "rows": 0,
                      "decode_s": 0.0, "prefills": 0, "prefill_s": 0.0}
        self._worker = threading.Thread(target=self._serve, name="generation", daemon=True)
        self._worker.start()

    # -- public -------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (a piece of a multi-byte character shows as U+FFFD)."""
        return self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None or self._stop.is_set()

    def submit(self, request: Request) -> Future:
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[Request]) -> list[Future]:
        """Queue `requests` as one: all or none (each is checked first), and the worker takes them in the same
        admission, so the prompts of one HTTP request join the batch at the same step."""
        if self.failure is not None or self.draining:
            raise EngineStopped("the server is shutting down" if self.draining else "the engine failed to start")
        for request in requests:
            if len(request.prompt_ids) + request.max_new_tokens > self.max_length:
                raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + tokens_to_generate "
                                 f"({request.max_new_tokens}) exceeds the served {self.max_length} positions")
        with self._intake:
            for request in requests:
                request.submitted_at = time.monotonic()
                self._queue.put(request)
        return [r.future for r in requests]

    def generate(self, requests: list[Request]) -> list[Completion]:
        """Submit `requests` together and wait for them all (benchmarks, tests)."""
        return [f.result() for f in self.submit_all(requests)]

    def drain(self, seconds: float) -> None:
        """Refuse new requests; those in flight may finish within `seconds`, then fail with EngineStopped."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + seconds

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker: whatever is still queued or decoding fails with EngineStopped."""
        self._stop.set()
        self._worker.join(timeout_s)

    # -- worker -------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self.warmup = self.decoder.warm_up()
        except Exception as err:  # noqa: BLE001  (any failure: reported, every request refused)
            log.exception("warm-up failed: %s", err)
            self.failure = err
            self._fail_queued(EngineStopped("the engine failed to start (see the server log)"))
            return
        w = self.warmup
        log.info("warm-up: %.1f s, %d CUDA graphs, KV cache %.2f GiB, %.2f GiB on the device in all (envelope: "
                 "%d rows x %d positions)", w.seconds, w.graphs, w.cache_bytes / 2**30, w.device_bytes / 2**30,
                 self.envelope.max_batch, self.envelope.max_seq_len)
        self.ready.set()
        rows: dict[int, _Row] = {}
        while not self._stop.is_set():
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                self._fail_rows(rows, EngineStopped("the server shut down before the request finished"))
                self._fail_queued(EngineStopped("the server shut down before the request started"))
                self._stop.wait(IDLE_WAIT_S)
                continue
            try:
                self._admit(rows)
                if rows:
                    self._step(rows)
            except Exception as err:  # noqa: BLE001  (delivered to every caller in the batch)
                log.exception("decoding failed: %s", err)
                self._fail_rows(rows, err)
        self._fail_rows(rows, EngineStopped("the server shut down before the request finished"))
        self._fail_queued(EngineStopped("the server shut down before the request started"))

    def _admit(self, rows: dict[int, _Row]) -> None:
        """Waiting requests into free rows (at most one per free row) as the join policy says, their prompts
        prefilled, grouped by prompt length; waits IDLE_WAIT_S for one when no row is decoding."""
        if not rows and not self._waiting:
            with contextlib.suppress(queue.Empty):
                self._waiting.append(self._queue.get(timeout=IDLE_WAIT_S))
        with self._intake:  # a submit_all under way: all of its requests, not the first few
            for _ in range(self._queue.qsize()):  # bounded: what is queued now
                with contextlib.suppress(queue.Empty):
                    self._waiting.append(self._queue.get_nowait())
        free = [slot for slot in range(self.envelope.max_batch) if slot not in rows]
        if not self._waiting or not free:
            return
        enough = min(len(free), self.join.rows_for(self.envelope.max_batch))
        if rows and len(self._waiting) < enough and \
                time.monotonic() - self._waiting[0].submitted_at < self.join.max_wait_s:
            return
        joining: list[Request] = []
        while self._waiting and len(joining) < len(free):
            req = self._waiting.popleft()
            if req.cancelled.is_set() or not req.future.set_running_or_notify_cancel():
                continue  # its client left while it waited
            self.stats["requests"] += 1
            if req.max_new_tokens == 0:
                self._complete(req, [], "length")
                continue
            joining.append(req)
        by_length: dict[int, list[Request]] = {}
        for req in joining:
            by_length.setdefault(len(req.prompt_ids), []).append(req)
        for group in by_length.values():
            slots = [free.pop(0) for _ in group]
            start = time.perf_counter()
            try:
                first = self.decoder.prefill(slots, [r.prompt_ids for r in group],
                                             [self._row_settings(r) for r in group]).tolist()
                self.stats["prefill_s"] += time.perf_counter() - start
                self.stats["prefills"] += 1
            except Exception as err:  # noqa: BLE001  (delivered to the group's callers)
                log.exception("prefill failed: %s", err)
                for slot, req in zip(slots, group):
                    self.decoder.release(slot)
                    _fail(req, err)
                continue
            for slot, req, token in zip(slots, group, first):
                rows[slot] = _Row(req, 4 * max(map(len, req.stop)) + 4 if req.stop else 0)
                self._accept(rows[slot], token)
        self._retire(rows)

    def _row_settings(self, req: Request) -> tuple[bool, float, int, float, int]:
        s = req.sampling
        if s.greedy:
            return True, 1.0, 0, 1.0, 0
        return False, s.temperature, s.top_k, s.top_p, seed_key(self._rng.getrandbits(64) if s.seed is None else s.seed)

    def _step(self, rows: dict[int, _Row]) -> None:
        length = max(len(r.request.prompt_ids) + len(r.tokens) for r in rows.values())  # columns to attend
        sampled = [r.request.sampling for r in rows.values() if not r.request.sampling.greedy]
        kind = ("filtered" if any(s.top_k > 0 or s.top_p < 1 for s in sampled) else "sample") if sampled else "greedy"
        start = time.perf_counter()
        new = self.decoder.step(max(rows) + 1, length, kind).tolist()
        self.stats["decode_s"] += time.perf_counter() - start
        self.stats["steps"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], len(rows))
        for slot, row in rows.items():
            self._accept(row, new[slot])
        self._retire(rows)

    def _accept(self, row: _Row, token: int) -> None:
        """The row's next token: appended and streamed, unless the row ends here."""
        req = row.request
        if req.cancelled.is_set():
            row.finish = "cancelled"
            return
        row.tokens.append(token)  # end-of-text too: it is generated, so counted, scored and in the logprobs
        self.stats["tokens"] += 1
        if req.on_token is not None:
            req.on_token(token)
        if token in self.eos and not req.ignore_eos:
            row.finish = "stop"
        elif req.stop and find_stop(self.decode(row.tokens[-row.window:]), req.stop) is not None:
            row.finish = "stop"
        elif len(row.tokens) >= req.max_new_tokens:
            row.finish = "length"

    def _retire(self, rows: dict[int, _Row]) -> None:
        for slot in [s for s, r in rows.items() if r.finish is not None]:
            row = rows.pop(slot)
            self.decoder.release(slot)
            self.stats["cancelled"] += row.finish == "cancelled"
            self._complete(row.request, row.tokens, "length" if row.finish == "cancelled" else row.finish)
        self.stats["rows"] = len(rows)

    def _complete(self, req: Request, tokens: list[int], finish: str) -> None:
        comp = Completion(req.prompt_ids, tokens, finish)
        try:
            if req.logprobs:
                comp.logprobs = self.sequence_logprobs(comp.prompt_ids + comp.token_ids)
            if req.top_logprobs is not None:
                comp.scores = self.token_scores(comp.prompt_ids + comp.token_ids, req.top_logprobs)
        except Exception as err:  # noqa: BLE001  (delivered to its caller)
            _fail(req, err)
            return
        if not req.future.done():
            req.future.set_result(comp)

    def _fail_rows(self, rows: dict[int, _Row], error: BaseException) -> None:
        for slot, row in rows.items():
            self.decoder.release(slot)
            _fail(row.request, error)
        rows.clear()
        self.stats["rows"] = 0

    def _fail_queued(self, error: BaseException) -> None:
        while self._waiting:
            _fail(self._waiting.popleft(), error)
        while True:  # bounded: submit() refuses new requests once stopping or failed
            try:
                _fail(self._queue.get_nowait(), error)
            except queue.Empty:
                return

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
