"""The decode state behind continuous batching: one KV cache of `max_batch` rows x `max_seq_len` columns, each
row its own timeline (its prompt at columns 0.., its n-th new token at len(prompt) + n - 1), so a request
joins a free row at any step and leaves when done. A decode step runs the first `b` rows against the first
`L` columns, (b, L) bucketed (powers of two up to the envelope); on CUDA every bucket's step is captured
into a CUDA graph at start-up (warm_up), one per kind (STEP_KINDS), so serving never compiles or captures.
With `compile`, the step's forward goes through torch.compile first (dynamic shapes: one compilation serves
every bucket, made at warm-up before the captures), so each replayed graph runs inductor's fused kernels
instead of the eager forward's many small ones. What is compiled is one decoder layer, reused for every layer
(PyTorch's regional compilation): the whole forward as one graph is a compilation that grows with the depth,
a layer's is the same at any depth. The layers differ only in their cache index, which a compiled layer
would specialise on, so in a decode step each layer gets its own cache tensors (LayerRows) and never sees
the index; the rest of the step (embedding, rotary tables, final norm, head) runs eagerly, in the same CUDA
graph. Prefill is eager, its layers too (a new prompt: its own shape, no graph, nothing compiled). Per-row
settings, positions and tokens live in static device buffers the graphs read.

Why not transformers' continuous batching (generate_batch / ContinuousBatchingManager, what `transformers
serve` runs): in 5.x it takes do_sample and the seed per manager, not per request, and captures its CUDA
graphs lazily, on the request path; this module keeps the model's own forward and attention (SDPA, the
prefill exactly generate()'s), which also keeps greedy rows equal to generate() in fp32."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.experimental._config

from kaiyuan_recipes.compat import graph_capture

from .row_cache import RowKVCache
from .sampling import RowSettings, next_tokens

log = logging.getLogger(__name__)
MIN_LENGTH_BUCKET = 256
# greedy: argmax only; sample: some row samples, none filters; filtered: some row has top-k or top-p (a sort)
STEP_KINDS = ("greedy", "sample", "filtered")
# one warm-up at a time in a process: another thread's device synchronize or allocation during a CUDA graph
# capture invalidates it (two engines warming up at once in one process, e.g. a benchmark's; an engine that is
# already serving while another warms up is not covered: one engine a process, as `kaiyuan serve` runs)
_WARM_UP = threading.Lock()


def buckets(limit: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two from `smallest` below `limit`, then `limit` itself."""
    out, size = [], smallest
    while size < limit:
        out.append(size)
        size *= 2
    return (*out, limit)


def batch_sizes(max_batch: int, compiled: bool) -> tuple[int, ...]:
    """The batch buckets. Compiled: no bucket of 1 (a batch of 1 would be a compilation of its own, as
    torch.compile specialises sizes 0 and 1), one request decodes in a bucket of 2."""
    return buckets(max_batch, 2 if compiled else 1)


def bucket_for(sizes: tuple[int, ...], n: int) -> int:
    return next(s for s in sizes if s >= n)


@dataclass(frozen=True)
class Envelope:
    """What the server prepares for at start-up and refuses beyond (a 400): at most max_batch rows decoding
    at once, prompt + new tokens within max_seq_len. capture: CUDA graphs per bucket (CUDA only); compile:
    the decode step's forward through torch.compile, at warm-up; regional (with compile): one decoder layer
    compiled for all, else the whole forward (a compilation that grows with the depth; kept to compare)."""

    max_batch: int = 32
    max_seq_len: int = 4096
    capture: bool = True
    compile: bool = False
    regional: bool = True

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_seq_len < 2:
            raise ValueError(f"envelope: max_batch >= 1 and max_seq_len >= 2, got {self.max_batch}, {self.max_seq_len}")

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        return batch_sizes(self.max_batch, self.compile)

    @property
    def length_buckets(self) -> tuple[int, ...]:
        return buckets(self.max_seq_len, min(MIN_LENGTH_BUCKET, self.max_seq_len))


def decoder_layers(model: Any) -> list[tuple[int, torch.nn.Module]] | None:
    """The model's decoder layers, the blocks that regional compilation compiles once for all: modules of the
    classes transformers keeps whole (_no_split_modules) that carry a cache index (a submodule's layer_idx),
    each with that index. None unless they are of one class, each with one index of its own."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = []
    for layer in (m for m in model.modules() if type(m).__name__ in names):
        indices = {m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)}
        if len(indices) > 1:
            return None
        if indices:
            layers.append((indices.pop(), layer))
    distinct = len({i for i, _ in layers}) == len(layers) and len({type(m) for _, m in layers}) == 1
    return layers if layers and distinct else None


def unapplied_sliding_window(model: Any, max_seq_len: int) -> str | None:
    """Why the batch decoder cannot serve `model` within max_seq_len positions, if a sliding window is the reason:
    the decoder builds its own attention masks, so a window the model's masks would apply is not applied. Either
    some layers are sliding (layer_types), or the modeling builds sliding-window masks from config.sliding_window
    for every layer (Mistral's, Phi-3's: whatever layer_types says). The sequence's last token is never attended
    to, so a window of max_seq_len - 1 is the whole sequence."""
    config = model.config
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers are not supported by the batch decoder"
    window = getattr(config, "sliding_window", None)
    windowed = hasattr(sys.modules.get(type(model).__module__), "create_sliding_window_causal_mask")
    if window and windowed and window < max_seq_len - 1:
        return (f"the model attends within a sliding window of {window} positions, which the batch decoder does "
                f"not apply: serve it with --max-seq-len {window + 1} at most")
    return None


def _forward_of(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


@dataclass
class WarmUp:
    seconds: float
    graphs: int
    cache_bytes: int
    device_bytes: int  # what warm-up took on the device: cache, graphs' memory pool, workspaces


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    kind: str


@dataclass
class BatchDecoder:
    model: Any
    envelope: Envelope
    device: str
    graphs: dict[tuple[int, int, str], _Graph] = field(default_factory=dict)
    captures: int = 0  # CUDA graphs captured: all at warm-up; a GPU test checks it never grows after

    def __post_init__(self) -> None:
        refusal = unapplied_sliding_window(self.model, self.envelope.max_seq_len)
        if refusal:
            raise ValueError(f"serving: {refusal}")
        rows, dev = self.envelope.max_batch, self.device
        # the cache and the column index one longer than the envelope: every window is then a strict prefix of
        # both, so a compiled step does not tell the full-length window (a slice as long as what it slices)
        # from the others and compile it again
        self.cache = RowKVCache(rows, self.envelope.max_seq_len + 1)
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=dev)  # of each row's input token
        self.active = torch.zeros(rows, dtype=torch.long, device=dev)  # 1 on rows holding a request
        self.settings = RowSettings(torch.ones(rows, dtype=torch.bool, device=dev),
                                    torch.ones(rows, device=dev), torch.zeros(rows, dtype=torch.long, device=dev),
                                    torch.ones(rows, device=dev), torch.zeros(rows, dtype=torch.long, device=dev),
                                    torch.zeros(rows, dtype=torch.long, device=dev))
        self.row_ids = torch.arange(rows, device=dev)
        self.columns = torch.arange(self.envelope.max_seq_len + 1, device=dev)
        self.capture = self.envelope.capture and dev.startswith("cuda")
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        # dynamic: batch and window sizes symbolic (a batch of 1 is its own specialisation), so the buckets
        # share one compilation rather than one each
        self._layers = decoder_layers(self.model) if self.envelope.compile and self.envelope.regional else None
        if self._layers:
            self._layer = torch.compile(_forward_of, dynamic=True)
            self._forward = self._regional_logits
            self.compiled = f"one {type(self._layers[0][1]).__name__} for its {len(self._layers)} layers"
        elif self.envelope.compile and not self.envelope.regional:
            self._forward, self.compiled = torch.compile(self._logits, dynamic=True), "the whole forward"
        else:  # not compiled; or no repeated decoder layers, whose whole forward would compile for minutes
            if self.envelope.compile:
                log.warning("no repeated decoder layers found: the decode step is not compiled (graph mode)")
            self._forward, self.compiled = self._logits, "nothing"

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The batch buckets of the step as it runs now (a step that failed to compile is captured eagerly,
        with the bucket of 1 again)."""
        return batch_sizes(self.envelope.max_batch, self.compiled != "nothing")

    @property
    def mode(self) -> str:
        """How steps run, in `kaiyuan serve --decode-mode`'s names (and "compiled, not captured" on a CPU), as
        they do now: a step that could not be captured at warm-up decodes eagerly."""
        compiled = self.compiled != "nothing"
        return ("compiled" if compiled else "graph") if self.capture else \
            ("compiled, not captured" if compiled else "eager")

    def _settings(self, rows: slice | torch.Tensor) -> RowSettings:
        s = self.settings
        return RowSettings(s.greedy[rows], s.temperature[rows], s.top_k[rows], s.top_p[rows], s.key[rows],
                           s.step[rows])

    @torch.inference_mode()
    def prefill(self, rows: list[int], prompts: list[list[int]], settings: list[tuple]) -> torch.Tensor:
        """Prompts of one length into free rows (eager), each row's settings (greedy, temperature, top_k,
        top_p, key) set: its first new token per row, also left in the token buffer for the next step."""
        index = torch.tensor(rows, device=self.device)
        greedy, temperature, top_k, top_p, key = zip(*settings)
        s = self.settings
        for buffer, values in ((s.greedy, greedy), (s.temperature, temperature), (s.top_k, top_k),
                               (s.top_p, top_p), (s.key, key)):
            buffer[index] = torch.tensor(values, dtype=buffer.dtype).to(self.device)
        s.step[index] = 0
        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        self.cache.prefill(index)
        positions = torch.arange(ids.shape[1], device=self.device)[None].expand(len(rows), -1)
        logits = self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                            logits_to_keep=1).logits[:, -1]
        first = next_tokens(logits, self._settings(index), filtering=any(k > 0 or p < 1 for _, _, k, p, _ in settings))
        self.tokens[index, 0] = first
        self.positions[index, 0] = ids.shape[1]
        s.step[index] = 1
        self.active[index] = 1
        return first

    def resume(self, rows: list[int], last_tokens: list[int], drawn: list[int]) -> None:
        """Rows just prefilled with a request's prompt and all its tokens but the last (a row that gave way,
        resuming): the next step reads that last token, not the prefill's draw, and the sampler's step counts the
        tokens drawn before, so a seeded row draws on as it would have without the pause."""
        index = torch.tensor(rows, device=self.device)
        self.tokens[index, 0] = torch.tensor(last_tokens, dtype=torch.long).to(self.device)
        self.settings.step[index] = torch.tensor(drawn, dtype=torch.long).to(self.device)

    def release(self, row: int) -> None:
        """The row holds no request: its position stays 0 (its writes land in its own column 0)."""
        self.active[row] = 0
        self.positions[row] = 0

    def _logits(self, tokens: torch.Tensor, positions: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        mask = (window[None, :] <= positions)[:, None, None, :]  # [batch, 1, 1, length]
        return self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=self.cache,
                          use_cache=True, logits_to_keep=1).logits[:, -1]

    def _regional_logits(self, tokens: torch.Tensor, positions: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """_logits with every decoder layer through the one compiled layer, each given its own cache view
        (LayerRows), the rest of the forward (embedding, rotary, final norm, head) eager. The layers are
        redirected for this forward only: the prefill runs them eagerly and compiles nothing."""
        before = [layer.__dict__.get("forward") for _, layer in self._layers]  # e.g. a hook's, kept
        for index, layer in self._layers:
            layer.forward = functools.partial(self._compiled_layer, index, layer)
        try:
            return self._logits(tokens, positions, window)
        finally:
            for (_, layer), forward in zip(self._layers, before):
                if forward is None:
                    del layer.forward
                else:
                    layer.forward = forward

    def _compiled_layer(self, index: int, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        kwargs["past_key_values"] = self.cache.layer(index)
        return self._layer(layer, *args, **kwargs)

    def _step(self, batch: int, length: int, kind: str) -> None:
        positions, window = self.positions[:batch], self.columns[:length]
        self.cache.decode(self.row_ids[:batch], positions[:, 0], window)
        logits = self._forward(self.tokens[:batch], positions, window)
        new = (logits.argmax(-1) if kind == "greedy"
               else next_tokens(logits, self._settings(slice(0, batch)), filtering=kind == "filtered"))
        self.tokens[:batch, 0] = new
        active = self.active[:batch]
        self.positions[:batch, 0] += active
        self.settings.step[:batch] += active

    @torch.inference_mode()
    def step(self, rows: int, length: int, kind: str) -> torch.Tensor:
        """One token for each of the first `rows` rows (bucketed up), attending to `length` columns (bucketed
        up); kind: one of STEP_KINDS. The new tokens, [bucketed rows]: a view of the token buffer, valid until
        the next step."""
        batch = bucket_for(self.batch_buckets, rows)
        length = bucket_for(self.envelope.length_buckets, length)
        graph = self.graphs.get((batch, length, kind))
        if graph is not None:
            graph.graph.replay()
        elif self.capture:
            raise RuntimeError(f"no CUDA graph for batch {batch}, length {length}: warm_up() captures them all")
        else:
            self._step(batch, length, kind)
        return self.tokens[:batch, 0]

    def warm_up(self) -> WarmUp:
        # compiling: no duck sizing, or a batch bucket equal to a model dimension (e.g. 8 rows and 8 KV heads)
        # would share its symbol, be specialised with it, and compile again at the next bucket
        with _WARM_UP, torch.fx.experimental._config.patch(use_duck_shape=False) if self.envelope.compile else \
                contextlib.nullcontext():
            return self._warm_up()

    @torch.inference_mode()
    def _warm_up(self) -> WarmUp:
        """Allocates the cache (a one-token prefill into row 0) and, on CUDA, captures every bucket's steps,
        largest first (later, smaller graphs reuse the shared pool's memory); compiled and not captured,
        runs every bucket's step once (what compiles does it here)."""
        start = time.perf_counter()
        cuda = self.device.startswith("cuda")
        free_before = torch.cuda.mem_get_info()[0] if cuda else 0
        self.prefill([0], [[0]], [(True, 1.0, 0, 1.0, 0)])
        self.release(0)
        if self.compiled != "nothing":
            log.info("warm-up: compiling the decode step (torch.compile: %s), then %s", self.compiled,
                     f"capturing {self._graph_count()} CUDA graphs" if self.capture else "running every bucket once")
        if self.capture:
            failure = self._capture_all(start)
            if failure and self.compiled != "nothing":  # the compiled step failed (an inductor or Triton failure)
                warnings.warn(f"compiled decode step not captured ({failure}); capturing the eager step instead "
                              "(graph mode)", stacklevel=2)
                self._forward, self.compiled = self._logits, "nothing"
                self._pool = torch.cuda.graph_pool_handle()  # not the failed capture's
                failure = self._capture_all(start)
            if failure:  # e.g. a MoE's data-dependent expert loop: served eagerly, said once
                warnings.warn(f"decode step not captured ({failure}); decoding eagerly", stacklevel=2)
                self.capture = False
                self._forward, self.compiled = self._logits, "nothing"
        elif self.compiled != "nothing":  # every bucket once: the compilations happen here, not when serving
            for batch in self.batch_buckets:
                for length in self.envelope.length_buckets:
                    self._step(batch, length, "filtered")
                log.info("warm-up: batch %d compiled for, %.1f s", batch, time.perf_counter() - start)
        else:
            self._step(1, self.envelope.length_buckets[0], "filtered")
        self.tokens.zero_()
        self.positions.zero_()
        self.settings.step.zero_()
        if cuda:
            torch.cuda.synchronize()
        used = free_before - torch.cuda.mem_get_info()[0] if cuda else self.cache.nbytes
        return WarmUp(time.perf_counter() - start, len(self.graphs), self.cache.nbytes, used)

    def _graph_count(self) -> int:
        return len(self.batch_buckets) * len(self.envelope.length_buckets) * len(STEP_KINDS)

    def _capture_all(self, start: float) -> str | None:
        """Every bucket's steps captured, largest first; on a failure, none kept and what failed (returned, not
        raised: nothing of the failed step stays referenced by a traceback while the caller tries again)."""
        try:
            for batch in reversed(self.batch_buckets):
                for length in reversed(self.envelope.length_buckets):
                    for kind in STEP_KINDS:
                        self.graphs[(batch, length, kind)] = _Graph(self._capture(batch, length, kind), kind)
                log.info("warm-up: batch %d captured, %d of %d CUDA graphs, %.1f s", batch, len(self.graphs),
                         self._graph_count(), time.perf_counter() - start)
            return None
        except Exception as err:  # noqa: BLE001  (the caller says it and falls back)
            failure = f"{type(err).__name__}: {str(err)[:200]}"
        self.graphs.clear()
        self.captures = 0
        torch.cuda.synchronize()
        return failure

    def _capture(self, batch: int, length: int, kind: str) -> torch.cuda.CUDAGraph:
        """No row is active during warm-up: the steps write only the rows' column 0 and move nothing on."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # cuBLAS / SDPA workspaces are allocated outside the capture
            self._step(batch, length, kind)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call from another thread (the HTTP side) cannot invalidate this capture
        with graph_capture(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._step(batch, length, kind)
        self.captures += 1
        return graph
