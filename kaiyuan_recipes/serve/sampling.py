"""Sampling for a decode batch whose rows each carry their own settings: transformers' warpers in generate()'s
order (temperature, then top-k, then top-p) with per-row tensors, then an inverse-CDF draw with one uniform
per row. The uniform is a hash of (the row's key, the row's step), not a torch.Generator's stream: a seeded
row then draws the same tokens whatever rows share its batch, and the whole draw is a fixed sequence of
tensor ops that a CUDA graph can hold (a generator per row would be one draw call per row per step, outside
any graph). The uniform has 23 bits: a token of probability below ~1e-7 is drawn a little less often than
that. Greedy rows take the argmax of the raw logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9  # a second round's offset (hash32(0) is 0)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) of int64 tensors holding values in [0, 2**32): products
    wrap past 2**63, but only their low 32 bits are kept, and those are exact."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A row's 32-bit noise key from a request's seed (any of 0 .. 2**64 - 1)."""
    return (seed ^ (seed >> 32) ^ 0x5BD1E995) & MASK32


@dataclass
class RowSettings:
    """Per-row sampling settings as device tensors of one length (the rows of a batch)."""

    greedy: torch.Tensor  # bool
    temperature: torch.Tensor  # float32; 1 on greedy rows (never divided by there)
    top_k: torch.Tensor  # int64; 0: no top-k filtering
    top_p: torch.Tensor  # float32; 1: no nucleus filtering
    key: torch.Tensor  # int64 in [0, 2**32): the noise key
    step: torch.Tensor  # int64: how many tokens the row has drawn before this one


def filtered(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
             top_p: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] logits as transformers' Temperature, TopK and TopP warpers leave them, each row with its
    own settings: scaled, -inf where filtered out (TopK keeps ties with the k-th value, as transformers')."""
    x = logits.float() / temperature[:, None]
    vocab = x.shape[-1]
    ordered, order = torch.sort(x, dim=-1, descending=True)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    kth = ordered.gather(-1, (k - 1)[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = ordered.softmax(-1)
    outside = probs.cumsum(-1) - probs >= top_p[:, None]  # the mass before it already reaches top_p
    outside[:, 0] = False  # the most likely token always stays
    outside &= (top_p < 1.0)[:, None]  # top_p 1: no warper (a cumulative sum's rounding must not cut the tail)
    ordered = ordered.masked_fill(outside, float("-inf"))
    return torch.empty_like(x).scatter_(-1, order, ordered)


def row_uniforms(key: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """[rows] uniforms in (0, 1), each a pure function of its row's (key, step)."""
    bits = hash32((hash32(key ^ hash32(step & MASK32)) + GOLDEN32) & MASK32) >> 9  # 23 bits: exact in float32
    return (bits.float() + 0.5) / float(1 << 23)


def next_tokens(logits: torch.Tensor, rows: RowSettings, filtering: bool = True) -> torch.Tensor:
    """[rows, vocab] logits -> [rows] next tokens: argmax on greedy rows, a draw from the filtered softmax on
    the others (the first token whose cumulative probability passes the row's uniform; zero-probability tokens
    are never drawn). filtering False: no row has top-k or top-p (the sort is skipped)."""
    scaled = (filtered(logits, rows.temperature, rows.top_k, rows.top_p) if filtering
              else logits.float() / rows.temperature[:, None])
    cdf = scaled.softmax(-1).cumsum(-1)
    target = row_uniforms(rows.key, rows.step) * cdf[:, -1]  # the sum's own rounding: never past the last token
    drawn = torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    return torch.where(rows.greedy, logits.argmax(-1), drawn)
