"""The generation engine behind `kaiyuan serve`: a HF causal LM decoding every request in one continuously
batched decode state (batch_decoder.py). A worker thread admits waiting requests into free rows (their prompts
prefilled, eagerly), runs one decode step for all rows (a CUDA graph captured at start-up, on CUDA), and
retires rows as they end: at end-of-text (a token of the completion), at max_new_tokens, at one of their stop
strings, or when their caller cancels them (a client gone). Each row samples with its own temperature / top-k /
top-p and seed (sampling.py), greedy rows take the argmax. New tokens reach streaming callers as they are
produced. Log-probabilities (with the top alternatives) come from a teacher-forced pass over prompt +
completion (scoring.py), one chunk of positions between two decode steps, one sequence at a time.

Fair turns (admission.py): free rows, and the scorer, go to the waiting calls round-robin, one request of each
call in turn; when every row is taken and a call holding none waits, the call holding the most rows gives one up
(never its last), whose request resumes later where it stopped (its prompt and tokens so far prefilled again). So
a call of many choices never keeps a later call waiting for one of its rows to end. The engine
holds at most a bounded number of unfinished requests; past it a call is refused (EngineBusy). `drain(seconds)`
lets in-flight requests finish, then fails what is left with EngineStopped."""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import attention
from .admission import EngineBusy, JoinPolicy, PendingLimit, RoundRobin, rows_to_give_up
from .batch_decoder import BatchDecoder, Envelope, WarmUp
from .request import Completion, EngineStopped, Request, Sampling, TokenScores
from .sampling import seed_key
from .scoring import SCORE_CHUNK, ScoringJob, score_chunk
from .stops import StopText

__all__ = ["Completion", "EngineBusy", "EngineStopped", "GenerationEngine", "JoinPolicy", "Request", "Sampling",
           "TokenScores"]

log = logging.getLogger(__name__)
DEFAULT_MAX_SEQ_LEN = 4096  # the envelope's positions when neither the model nor --max-seq-len says fewer
IDLE_WAIT_S = 0.05  # with no row decoding, the worker waits this long for a request, then looks again
# unfinished requests the engine holds beyond its rows, by default: room for the largest call (128 completions)
# twice over; more is refused (a 429), not queued without end
DEFAULT_MAX_QUEUE = 256


@dataclass
class _Row:
    """A request waiting for a row or decoding in one; with stop strings, its text read for them as it grows. A
    request that gave its row up waits again with its tokens so far (and its sampling settings: its noise key)."""

    request: Request
    stops: StopText | None = None
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None  # "stop", "length" or "cancelled" once ended
    settings: tuple[bool, float, int, float, int] | None = None  # the decoder's row settings, from its first join

    @property
    def resuming(self) -> bool:
        return bool(self.tokens)

    @property
    def prefill_ids(self) -> list[int]:
        """What a join prefills: the prompt, and for a resuming row its tokens but the last (the next step's
        input)."""
        return self.request.prompt_ids + self.tokens[:-1]


@dataclass
class _Scoring:
    """A completed request whose logprobs are being computed."""

    request: Request
    completion: Completion
    job: ScoringJob


def _fail(request: Request, error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)


class GenerationEngine:
    def __init__(self, model_dir: Path, device: str | None = None, envelope: Envelope | None = None,
                 dtype: torch.dtype | None = None, join: JoinPolicy = JoinPolicy(), max_queue: int = DEFAULT_MAX_QUEUE,
                 score_chunk: int = SCORE_CHUNK):
        """max_queue: unfinished requests held beyond the envelope's rows (more: EngineBusy); score_chunk:
        positions per scoring forward."""
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
        self.score_chunk = score_chunk
        self.pending = PendingLimit(self.envelope.max_batch + max_queue)
        self._calls = 0  # submit_all calls so far: each one's requests share a call number
        self._queue: queue.Queue[Request] = queue.Queue()
        self._intake = threading.Lock()  # held while a submit_all queues its requests, and while _admit takes them
        self._waiting: RoundRobin[_Row] = RoundRobin()  # taken off the queue (or given way), not decoding, by call
        self._scoring: RoundRobin[_Scoring] = RoundRobin()  # completed, their logprobs not yet computed, by call
        self._scored: _Scoring | None = None  # the one being scored (its cache: one sequence's keys and values)
        self._rng = random.Random()  # noise keys of unseeded sampled rows
        # rows admitted, most rows in one step, new tokens, rows ended because their caller left (a client gone),
        # rows given up to a call holding none (each resumed later); seconds in decode steps (each until its tokens
        # reach the host), in prefills and in scoring chunks: with the wall time, where a loaded server's time goes
        self.stats = {"requests": 0, "steps": 0, "max_batch": 0, "tokens": 0, "cancelled": 0, "rows": 0, "gave_way": 0,
                      "decode_s": 0.0, "prefills": 0, "prefill_s": 0.0, "score_chunks": 0, "score_s": 0.0}
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
        """Queue `requests` as one call: all or none (each is checked first, EngineBusy when the engine holds
        too much), and the worker takes them in the same admission, so the prompts of one HTTP request join the
        batch at the same step when rows are free."""
        if self.failure is not None or self.draining:
            raise EngineStopped("the server is shutting down" if self.draining else "the engine failed to start")
        for request in requests:
            if len(request.prompt_ids) + request.max_new_tokens > self.max_length:
                raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + tokens_to_generate "
                                 f"({request.max_new_tokens}) exceeds the served {self.max_length} positions")
        self.pending.admit(len(requests))
        with self._intake:
            self._calls += 1
            for request in requests:
                request.submitted_at, request.call = time.monotonic(), self._calls
                request.future.add_done_callback(self.pending.release)
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
        while not self._stop.is_set():  # each turn is short (a step, a prefill, a scoring chunk): a stop is seen
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                self._fail_rows(rows, EngineStopped("the server shut down before the request finished"))
                self._fail_scoring(EngineStopped("the server shut down before the request finished"))
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
            self._score_next()
        self._fail_rows(rows, EngineStopped("the server shut down before the request finished"))
        self._fail_scoring(EngineStopped("the server shut down before the request finished"))
        self._fail_queued(EngineStopped("the server shut down before the request started"))

    def _admit(self, rows: dict[int, _Row]) -> None:
        """Waiting requests into free rows (at most one per free row, the calls in turn) as the join policy says,
        their prompts prefilled, grouped by length; with no row free, rows given up to the calls that hold none
        (admission.rows_to_give_up). Waits IDLE_WAIT_S for a request when nothing else is to do."""
        if not rows and not self._waiting and not self._scoring and self._scored is None:
            with contextlib.suppress(queue.Empty):
                self._take_in(self._queue.get(timeout=IDLE_WAIT_S))
        with self._intake:  # a submit_all under way: all of its requests, not the first few
            for _ in range(self._queue.qsize()):  # bounded: what is queued now
                with contextlib.suppress(queue.Empty):
                    self._take_in(self._queue.get_nowait())
        if not self._waiting:
            return
        free = [slot for slot in range(self.envelope.max_batch) if slot not in rows]
        holding = {row.request.call for row in rows.values()}
        # with no row free, only the calls holding none join (rows are given up for them)
        heads = [(call, row) for call, row in self._waiting.heads() if free or call not in holding]
        if not heads:
            return
        enough = self.join.rows_for(self.envelope.max_batch)  # gathered as joins into free rows are
        enough = min(enough, len(free)) if free else enough
        waiting = len(self._waiting) if free else len(heads)
        if rows and waiting < enough and \
                time.monotonic() - min(r.request.submitted_at for _, r in heads) < self.join.max_wait_s:
            return
        joining: list[_Row] = []
        if free:
            while self._waiting and len(joining) < len(free):
                row = self._waiting.take()
                joining += [row] if self._starts(row) else []
        else:
            free = self._give_up(rows, len(heads))
            for call, _ in heads[:len(free)]:
                row = self._waiting.take_of(call)
                joining += [row] if self._starts(row) else []
        by_length: dict[int, list[_Row]] = {}
        for row in joining:
            by_length.setdefault(len(row.prefill_ids), []).append(row)
        for group in by_length.values():
            slots = [free.pop(0) for _ in group]
            start = time.perf_counter()
            try:
                first = self.decoder.prefill(slots, [r.prefill_ids for r in group],
                                             [r.settings for r in group]).tolist()
                resumed = [(slot, r) for slot, r in zip(slots, group) if r.resuming]
                if resumed:
                    self.decoder.resume([slot for slot, _ in resumed], [r.tokens[-1] for _, r in resumed],
                                        [len(r.tokens) for _, r in resumed])
                self.stats["prefill_s"] += time.perf_counter() - start
                self.stats["prefills"] += 1
            except Exception as err:  # noqa: BLE001  (delivered to the group's callers)
                log.exception("prefill failed: %s", err)
                for slot, row in zip(slots, group):
                    self.decoder.release(slot)
                    _fail(row.request, err)
                continue
            for slot, row, token in zip(slots, group, first):
                rows[slot] = row
                if not row.resuming:
                    self._accept(row, token)
        self._retire(rows)

    def _take_in(self, req: Request) -> None:
        """A request off the queue into the waiting line, as a row not yet decoding."""
        self._waiting.add(req.call, _Row(req, StopText(self.decode, req.stop) if req.stop else None))

    def _starts(self, row: _Row) -> bool:
        """Whether a row taken from the waiting line joins the batch: not when its caller left (or it needs no
        row: max_tokens 0), which answers it here."""
        req = row.request
        if row.resuming:
            if req.cancelled.is_set():  # its client left while it waited to resume
                self.stats["cancelled"] += 1
                self._complete(req, row.tokens, "length")
                return False
            return True
        if req.cancelled.is_set():  # its client left while it waited: it never starts
            req.future.cancel()  # done: its place in the bound is free
            return False
        if not req.future.set_running_or_notify_cancel():
            return False  # cancelled by its caller while it waited
        self.stats["requests"] += 1
        if req.max_new_tokens == 0:
            self._complete(req, [], "length")
            return False
        row.settings = self._row_settings(req)
        return True

    def _give_up(self, rows: dict[int, _Row], newcomers: int) -> list[int]:
        """Rows given up for `newcomers` calls that hold none (admission.rows_to_give_up), their requests back
        first in their calls' lines, to resume where they stopped; the slots now free."""
        by_call: dict[int, list[int]] = {}
        for slot in sorted(rows, key=lambda s: len(rows[s].prefill_ids)):  # the cheapest to prefill again first
            by_call.setdefault(rows[slot].request.call, []).append(slot)
        slots = rows_to_give_up(by_call, newcomers)
        for slot in slots:
            row = rows.pop(slot)
            self.decoder.release(slot)
            self._waiting.put_back(row.request.call, row)
        self.stats["gave_way"] += len(slots)
        return slots

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
        elif row.stops is not None and row.stops.ended_by(token):
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
        if req.scored and not req.cancelled.is_set():  # its logprobs are computed in turn (_score_next)
            self._scoring.add(req.call, _Scoring(req, comp, ScoringJob(comp.prompt_ids + tokens, req.top_logprobs)))
        elif not req.future.done():
            req.future.set_result(comp)

    def _score_next(self) -> None:
        """One chunk of the scoring under way, or of the next call's in turn; a request done is answered."""
        while self._scored is None and self._scoring:
            candidate = self._scoring.take()
            if not candidate.request.cancelled.is_set():  # its caller left: not scored
                self._scored = candidate
            else:
                _fail(candidate.request, EngineStopped("the request was cancelled"))
        scored = self._scored
        if scored is None:
            return
        start = time.perf_counter()
        try:
            score_chunk(self.model, self.device, scored.job, self.score_chunk)
        except Exception as err:  # noqa: BLE001  (delivered to its caller)
            log.exception("scoring failed: %s", err)
            self._scored = None
            _fail(scored.request, err)
            return
        self.stats["score_chunks"] += 1
        self.stats["score_s"] += time.perf_counter() - start
        if scored.request.cancelled.is_set() or scored.job.finished:
            self._scored = None
            comp, job, req = scored.completion, scored.job, scored.request
            if req.cancelled.is_set():
                _fail(req, EngineStopped("the request was cancelled"))
                return
            if req.logprobs:
                comp.logprobs = job.megatron_logprobs()
            if req.top_logprobs is not None:
                comp.scores = TokenScores(job.openai_logprobs(), job.alternatives)
            if not req.future.done():
                req.future.set_result(comp)

    def _fail_scoring(self, error: BaseException) -> None:
        if self._scored is not None:
            _fail(self._scored.request, error)
            self._scored = None
        for scoring in self._scoring.take_all():
            _fail(scoring.request, error)

    def _fail_rows(self, rows: dict[int, _Row], error: BaseException) -> None:
        for slot, row in rows.items():
            self.decoder.release(slot)
            _fail(row.request, error)
        rows.clear()
        self.stats["rows"] = 0

    def _fail_queued(self, error: BaseException) -> None:
        for row in self._waiting.take_all():
            _fail(row.request, error)
        while True:  # bounded: submit() refuses new requests once stopping or failed
            try:
                _fail(self._queue.get_nowait(), error)
            except queue.Empty:
                return
