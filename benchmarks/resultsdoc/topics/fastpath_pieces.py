"""What each fast-path piece adds: the A/B runs inside one process, and the eager step's profile."""

from __future__ import annotations

import re

from resultsdoc.entries import Data
from resultsdoc.formatting import GIB, gain, mem, n0
from resultsdoc.topics.throughput import batch_of


def _qwen3_rows(d: Data) -> Data:
    return d["results"]["qwen3_1p7b"]


def _qwen3_setting(d: Data) -> str:
    return f"qwen3_1p7b {batch_of(d, 'qwen3_1p7b')}, seq {d['seq_length']}"


def chunked_ab(d: Data) -> str:
    a, b = _qwen3_rows(d)["ours"], _qwen3_rows(d)["ours_full_logits"]
    return (f"{_qwen3_setting(d)}: chunked loss {n0(a['tokens_per_s'])} tokens/s vs {n0(b['tokens_per_s'])} with full "
            "logits; "
            f"{mem(a['peak_mem_gb'], GIB)} vs {mem(b['peak_mem_gb'], GIB)}.")


def norm_ab(d: Data) -> str:
    a, b = _qwen3_rows(d)["ours"], _qwen3_rows(d)["ours_torch_norm"]
    return (f"{_qwen3_setting(d)}: compiled RMSNorm {n0(a['tokens_per_s'])} vs {n0(b['tokens_per_s'])} with torch's "
            f"norm ({gain(a['tokens_per_s'], b['tokens_per_s'])}).")


def graph_ab(d: Data) -> str:
    parts = []
    for model in ("gpt_smoke", "qwen3_1p7b"):
        g, e = d["results"][model]["ours_full_cuda_graph"], d["results"][model]["ours"]
        parts.append(f"{model} ({batch_of(d, model)}) {n0(g['tokens_per_s'])} graphed vs {n0(e['tokens_per_s'])} eager "
                     f"({gain(g['tokens_per_s'], e['tokens_per_s'])}, peak memory "
                     f"{g['peak_mem_gb'] - e['peak_mem_gb']:+.1f} {GIB})")
    return "Whole-step CUDA graph: " + "; ".join(parts) + "."


def _same_losses(rows: list[Data], within: float) -> tuple[int, int]:
    """At how many steps all rows' losses lie within `within` of each other, of how many."""
    losses = [r["losses"] for r in rows]
    steps = min(map(len, losses))
    same = sum(max(ls[i] for ls in losses) - min(ls[i] for ls in losses) < within for i in range(steps))
    return same, steps


def step_fusion(d: Data) -> str:
    q = _qwen3_rows(d)
    eager, fusion = q["ours"]["tokens_per_s"], q["ours_wgrad_fusion"]["tokens_per_s"]
    graph, both = q["ours_full_cuda_graph"]["tokens_per_s"], q["ours_graph_wgrad_fusion"]["tokens_per_s"]
    rows = [q[k] for k in ("ours", "ours_wgrad_fusion", "ours_full_cuda_graph", "ours_graph_wgrad_fusion")]
    (close, steps), (near, _) = _same_losses(rows, 1e-3), _same_losses(rows, 5e-3)
    return (f"{_qwen3_setting(d)}, graph and fused weight-gradient accumulation: eager {n0(eager)}; eager + fusion "
            f"{n0(fusion)} ({gain(fusion, eager)}); graph {n0(graph)}; graph + fusion {n0(both)} "
            f"({gain(both, graph)} over the graph alone, {gain(both, eager)} over eager). The four losses lie within "
            f"0.001 of each other at {close} of {steps} steps (within 0.005 at {near}).")


def host_loaded(d: Data) -> str:
    q = _qwen3_rows(d)
    return (f"{_qwen3_setting(d)} on a loaded host (the other GPU running three trainings): the graphed step kept "
            f"{n0(q['ours_full_cuda_graph']['tokens_per_s'])} tokens/s while the eager one fell to "
            f"{n0(q['ours']['tokens_per_s'])}.")


def _family_ms(d: Data) -> dict[str, float]:
    """The profile summary's "by family" lines: family -> ms."""
    out = {}
    for line in d["summary"]:
        if m := re.match(r"\s+([\d.]+)\s+[\d.]+%\s+(gemm|attention|other element-wise|compiled \(triton\))$", line):
            out[m.group(2)] = float(m.group(1))
    return out


def profile_eager(d: Data) -> str:
    kernels = float(re.search(r"\(([\d.]+) ms in \d+ events\)", d["summary"][0]).group(1))
    fam = _family_ms(d)
    grad = re.search(r"main-grad accumulation[^)]*\) ([\d.]+) ms", d["note"]).group(1)
    norm = re.search(r"torch's RMSNorm kernels \([^)]*\) ([\d.]+) ms", d["note"]).group(1)
    return (f"{d['model']} micro batch {d['micro_batch']} × {d['micro_batches']}, seq {d['seq_length']}, the eager "
            f"fast-spec step before the compiled RMSNorm, profiled: {kernels} ms of kernels in a "
            f"{d['step_ms_without_profiler']:.0f} ms step; GEMMs {fam['gemm']:.0f} ms, attention "
            f"{fam['attention']:.0f} ms, torch's RMSNorm {float(norm):.0f} ms, main-grad accumulation "
            f"{float(grad):.0f} ms (the note's figures).")
