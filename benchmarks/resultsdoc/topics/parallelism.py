"""Tensor parallelism and the ZeRO stages over two GPUs."""

from __future__ import annotations

import re
import statistics

from resultsdoc.entries import Data
from resultsdoc.formatting import GIB, mem, n0, pct
from resultsdoc.provenance import commands_of


def tp2(d: Data) -> str:
    p = d["results"]["tp1_vs_tp2"]
    a, b = p["loss_a"], p["loss_b"]
    return (f"gpt_smoke at TP=2 over two GPUs trains like TP=1 ({p['iterations']} steps, TP=2 {b[0]:.2f} → "
            f"{b[-1]:.2f}; mean of the last 10 losses TP=2 {statistics.mean(b[-10:]):.2f} vs TP=1 "
            f"{statistics.mean(a[-10:]):.2f}). That run drew each TP rank's weights from its own RNG stream "
            f"(iteration 1's loss {pct(abs(b[0] - a[0]) / a[0])} apart); the script now starts both from the same "
            "weights (CPU initialisation), not yet run there. The step-level comparison is "
            "`tests/test_fast_spec_tp.py`.")


ZERO_LABELS = {"1gpu": "1 GPU", "2gpu_zero0": "ZeRO 0 (DDP)", "2gpu_zero1": "ZeRO 1 (distributed optimizer)",
               "2gpu_zero2": "ZeRO 2 (Megatron-FSDP)", "2gpu_zero2_bf16_comm": "ZeRO 2 (Megatron-FSDP, bf16 "
               "reduce-scatter: `ddp.megatron_fsdp_grad_comm_dtype=bf16`)"}


def zero_caption(d: Data) -> str:
    return (f"{d['model']}, {d['layer_spec']} spec, micro batch {d['micro_batch']} × {d['micro_batches_per_gpu']} "
            "per GPU, "
            f"{'chunked loss' if d.get('chunked_loss') or 'chunked' in ' '.join(commands_of(d)) else 'full logits'}"
            f", peak memory in {GIB}. Rows that could not finish are listed with their error.")


def zero_rows(d: Data) -> list[list[str]]:
    rows = []
    for name, row in d["results"].items():
        label = ZERO_LABELS.get(name, name)
        if "tokens_per_s" not in row:
            rows.append([label, row.get("error", "no figure"), "", ""])
            continue
        eff = row.get("scaling_efficiency")
        effs = (f"not computed: {row['scaling_efficiency_not_computed']}" if "scaling_efficiency_not_computed" in row
                else "" if eff is None else f"**{pct(eff)}**" if eff >= d["target_scaling_efficiency"] else pct(eff))
        done = re.search(r"(\d+) of \d+ steps done", row.get("incomplete", ""))
        steady = f": {max(int(done.group(1)) - 3, 0)} steady" if done else ""
        note = f" ({row['incomplete']}{steady})" if row.get("incomplete") else ""
        rows.append([label + note, n0(row["tokens_per_s"]), effs, mem(row["peak_mem_gb"], GIB)])
    return rows
