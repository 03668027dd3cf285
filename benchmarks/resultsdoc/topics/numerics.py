"""Numerics: the fast spec's loss against the local spec's, the noise floor, and determinism."""

from __future__ import annotations

import statistics
from typing import Callable

from resultsdoc.entries import Data
from resultsdoc.formatting import pct


def _pair(d: Data, name: str) -> Data:
    return d["results"][name]


def max_rel_rows(pairs: tuple[tuple[str, str], ...]) -> Callable[[Data], list[list[str]]]:
    return lambda d: [[label, pct(_pair(d, key)["max_rel_loss_diff"])] for key, label in pairs]


def _below(pair: Data) -> tuple[int, int, float, float]:
    """b's loss below a's: at how many points, of how many; mean and last-nine mean of (a - b) / a."""
    a, b = pair["loss_a"], pair["loss_b"]
    rel = [(x - y) / x for x, y in zip(a, b)]
    return sum(r > 0 for r in rel), len(rel), statistics.mean(rel), statistics.mean(rel[-9:])


def onepass_after(d: Data) -> str:
    below, n, mean, last9 = _below(_pair(d, "local_vs_fast_onepass"))
    noise = _below(_pair(d, "noise_floor_fast_vs_fast_fused_ce_onepass"))[2]
    return (f"In one pass the fast spec's loss is below the local spec's at {below} of {n} logged points (mean "
            f"{pct(mean)}, the last nine {pct(last9)}), while the noise-floor pair averages {pct(noise)}: a "
            "systematic difference in the fast spec's favour (the local spec rounds attention scores to bf16; see "
            "[docs/fastpath.md](../docs/fastpath.md#numerics)).")


def foreach_adam(d: Data) -> str:
    below, n, mean, _ = _below(_pair(d, "local_vs_fast_foreach_adam_onepass"))
    return (f"With torch's foreach AdamW step instead of the fused one the fast spec sits below the local spec just "
            f"the same (mean {pct(mean)}, {below} of {n} points).")


def determinism(d: Data) -> str:
    r = d["results"]
    local = r["local_spec"]
    fast = [r["fast_spec"], r["fast_spec_again"]]
    first = sorted({p["first_differing_iteration"] for p in fast})
    return (f"gpt_smoke, {local['iterations']} iterations, two same-seed runs of `tests/gpu/stop_resume.sh`: the "
            f"local spec is {'bit-identical at every iteration' if local['bit_identical_losses'] else 'not identical'}"
            f"; the fast spec differs from iteration {', '.join(map(str, first))} (max relative difference "
            f"{' and '.join(pct(p['max_rel_loss_diff']) for p in fast)} over the {fast[0]['iterations']} "
            "iterations), SDPA's backward not being deterministic.")
