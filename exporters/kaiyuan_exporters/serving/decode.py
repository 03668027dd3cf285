"""Decoding against a static KV cache. One decode step (one token per row in, the next token per row out
when greedy, the last logits when sampling) is compiled by torch.compile and, on CUDA, captured into a CUDA
graph per (batch, cache length):
a step then costs one graph launch instead of hundreds of kernel launches, which is what bounds a 2B
model at batch 1 (the approach of SGLang's CUDA-graph runner: inductor without its own graphs, captured
by the caller). When capture fails the decoder falls back, with a warning, to torch.compile's own CUDA
graphs (mode "reduce-overhead"), and to the eager step when compilation fails. Sampling (Sampler) runs on
the captured step's logits, outside the graph: the random draws stay with torch's generator."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

DECODE_MODES = ("graph", "reduce-overhead", "eager")
CACHE_LENGTH_MULTIPLE = 256  # cache lengths are rounded up to this: fewer shapes to compile and capture
# Each (batch, cache length) is one compilation of the same decode function; dynamo's default limit of 8
# per function would silently turn a server that has seen 9 batch sizes back to eager decoding.
RECOMPILE_LIMIT = 64
STREAM_EVERY = 4  # streaming: new tokens go to the host every this many steps (one sync each time)


def left_pad(
    prompts: list[list[int]], pad_id: int, mask_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of any lengths as one left-padded batch (every row's next token at the same place): ids
    [batch, width] and the attention mask over `mask_length` positions (default width), 0 at the padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.ones((len(prompts), mask_length or width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, : width - len(prompt)] = 0
    return ids, mask


class CapturedStep:
    """A decode step recorded into a torch.cuda.CUDAGraph against one slot's static cache and inputs;
    calling it copies the tokens into the graph's input buffer and replays (the step, then the positions'
    increment). Its output buffer is overwritten by the next call."""

    def __init__(self, step, slot: "Slot", device: str, pool: Any, warmup: int = 2):
        self.tokens = torch.zeros((slot.mask.shape[0], 1), dtype=torch.long, device=device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles, autotunes and allocates outside the capture
            for _ in range(warmup):
                step(self.tokens, slot.cache, slot.mask, slot.positions)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = step(self.tokens, slot.cache, slot.mask, slot.positions)
            slot.positions.add_(1)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.graph.replay()
        return self.out


@dataclass(frozen=True)
class Sampler:
    """transformers' sampling, in its order: temperature, then top-k, then top-p (nucleus), then a draw
    from the softmax. top_k 0 and top_p 1 mean no filtering."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0

    def filtered(self, logits: torch.Tensor) -> torch.Tensor:
        """[batch, vocab] logits as transformers' warpers leave them: scaled, -inf where filtered out."""
        x = logits.float() / self.temperature
        if 0 < self.top_k < x.shape[-1]:
            x = x.masked_fill(x < torch.topk(x, self.top_k, dim=-1).values[:, -1:], float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(x, dim=-1, descending=True)
            probs = ordered.softmax(-1)
            outside = probs.cumsum(-1) - probs >= self.top_p  # the mass before it already reaches top_p
            outside[:, 0] = False  # the most likely token always stays
            x = x.masked_fill(outside.scatter(-1, order, outside), float("-inf"))
        return x

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(self.filtered(logits).softmax(-1), 1)[:, 0]


@dataclass
class Slot:
    """One (batch, cache length): a static KV cache, the static inputs every decode step reads (the padding
    mask over the whole cache, each row's next position) and, in graph mode, the captured steps by kind
    ("tokens": greedy, "logits": for a sampler), each captured when first needed."""

    cache: Any
    mask: torch.Tensor  # [batch, cache length], 0 at left padding
    positions: torch.Tensor  # [batch, 1]
    graphs: dict[str, CapturedStep] = field(default_factory=dict)


class StaticDecoder:
    def __init__(self, model: Any, device: str, mode: str | None = None, max_length: int | None = None,
                 pad_id: int = 0):
        self.model, self.device, self.pad_id = model, device, pad_id
        self.mode = mode or ("graph" if device.startswith("cuda") else "eager")
        if self.mode not in DECODE_MODES:
            raise ValueError(f"decode mode {self.mode!r}: expected one of {', '.join(DECODE_MODES)}")
        if self.mode != "eager" and not device.startswith("cuda"):
            raise ValueError(f"decode mode {self.mode!r} needs a CUDA device, got {device!r}")
        self.max_length = max_length
        self._set_mode(self.mode)
        self.slots: dict[tuple[int, int], Slot] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.mode == "graph" else None

    def eager_logits(self, tokens: torch.Tensor, cache: Any, mask: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache,
                          use_cache=True).logits[:, -1]

    def eager_step(self, tokens: torch.Tensor, cache: Any, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.eager_logits(tokens, cache, mask, positions).argmax(-1)

    def _set_mode(self, mode: str) -> None:
        """The decode steps by kind for `mode`: "tokens" (greedy) and "logits" (a sampler draws after it)."""
        self.mode = mode
        eager = {"tokens": self.eager_step, "logits": self.eager_logits}
        if mode == "eager":
            self.steps = eager
            return
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        # graph mode: inductor's fused kernels, captured by CapturedStep (not by inductor's cudagraph trees)
        self.steps = {kind: torch.compile(step, mode=None if mode == "graph" else mode, fullgraph=True)
                      for kind, step in eager.items()}

    def _fall_back(self, mode: str, why: BaseException) -> None:
        warnings.warn(f"decode step: {self.mode} failed ({type(why).__name__}: {str(why)[:200]}); using {mode}",
                      stacklevel=3)
        self._set_mode(mode)
        self.slots.clear()  # caches of a failed capture are not reused

    def slot(self, batch: int, length: int, kind: str = "tokens") -> Slot:
        """The slot for (batch, cache length rounded up), with its `kind` step captured in graph mode (before
        the request's prefill, which resets the cache and sets the positions)."""
        from transformers import StaticCache

        length = -(-length // CACHE_LENGTH_MULTIPLE) * CACHE_LENGTH_MULTIPLE
        if self.max_length:
            length = min(length, self.max_length)
        slot = self.slots.get((batch, length))
        if slot is None:
            slot = self.slots[(batch, length)] = Slot(
                StaticCache(config=self.model.config, max_cache_len=length),
                torch.ones((batch, length), dtype=torch.long, device=self.device),
                torch.zeros((batch, 1), dtype=torch.long, device=self.device))
        if self.mode != "graph" or kind in slot.graphs:
            return slot
        slot.positions.zero_()  # in range for the warm-up steps
        try:  # a one-token prefill allocates the cache's tensors (lazily) before the capture records them
            self.eager_step(torch.zeros((batch, 1), dtype=torch.long, device=self.device), slot.cache,
                            slot.mask, slot.positions)
            slot.graphs[kind] = CapturedStep(self.steps[kind], slot, self.device, self._pool)
        except Exception as err:  # noqa: BLE001  (capture or compilation failed: any of many error types)
            self._fall_back("reduce-overhead", err)
            return self.slot(batch, length, kind)
        return slot

    def advance(self, slot: Slot, tokens: torch.Tensor, sampler: Sampler | None = None) -> torch.Tensor:
        """tokens (batch,) -> the next token per row (greedy, or drawn by `sampler`); the cache and the
        positions move on by one."""
        kind = "tokens" if sampler is None else "logits"
        if kind in slot.graphs:
            out = slot.graphs[kind](tokens[:, None])
        else:
            try:
                out = self.steps[kind](tokens[:, None].clone(), slot.cache, slot.mask, slot.positions)
            except torch._dynamo.exc.TorchDynamoException as err:
                if self.mode == "eager":
                    raise
                # a model torch.compile cannot capture whole (e.g. a MoE block's data-dependent expert loop)
                self._set_mode("eager")
                warnings.warn(f"decode step not compiled ({type(err).__name__}); decoding eagerly", stacklevel=2)
                return self.advance(slot, tokens, sampler)
            slot.positions.add_(1)
        return out if sampler is None else sampler(out)

    @torch.inference_mode()  # the cache's tensors are inference tensors: reset them in the mode too
    def decode(self, prompts: list[list[int]], new_tokens: int, eos: set[int], stop_early: bool,
               on_tokens: Callable[[list[list[int]]], bool | None] | None = None,
               sampler: Sampler | None = None) -> torch.Tensor:
        """Prompts of any lengths (left-padded here) -> (batch, <= new_tokens) continuations, greedy unless a
        sampler is given. Tokens stay on the device; end-of-text is checked every 32 steps when stop_early.
        on_tokens, if given, receives the new tokens (a list per row) every STREAM_EVERY steps and at the end;
        when it returns True, decoding stops there."""
        batch, width = len(prompts), max(len(p) for p in prompts)
        slot = self.slot(batch, width + new_tokens, "tokens" if sampler is None else "logits")
        slot.cache.reset()
        ids, mask = left_pad(prompts, self.pad_id, slot.mask.shape[1])
        pads = torch.tensor([width - len(p) for p in prompts])
        slot.mask.copy_(mask)  # in place: a captured graph reads these addresses
        positions = (torch.arange(width)[None] - pads[:, None]).clamp(min=0).to(self.device)
        slot.positions.copy_(positions[:, -1:] + 1)
        out = torch.empty((batch, new_tokens), dtype=torch.long, device=self.device)
        eos_ids = torch.tensor(sorted(eos), device=self.device) if stop_early and eos else None
        logits = self.eager_logits(ids.to(self.device), slot.cache, slot.mask, positions)  # prefill
        tokens = logits.argmax(-1) if sampler is None else sampler(logits)
        out[:, 0] = tokens
        streamed = 0
        for step in range(1, new_tokens):
            tokens = self.advance(slot, tokens, sampler)
            out[:, step] = tokens
            if on_tokens is not None and (step + 1) % STREAM_EVERY == 0:
                finished = on_tokens(out[:, streamed: step + 1].tolist())
                streamed = step + 1
                if finished:  # every row ended (a stop string, a cancelled request)
                    out = out[:, :streamed]
                    break
            if eos_ids is not None and step % 32 == 0 and bool(torch.isin(out[:, : step + 1], eos_ids).any(1).all()):
                out = out[:, : step + 1]
                break
        if on_tokens is not None and streamed < out.shape[1]:
            on_tokens(out[:, streamed:].tolist())
        return out
