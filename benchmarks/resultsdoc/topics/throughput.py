"""Training throughput: the fast spec against Megatron's local spec and transformers, and the default step's profile."""

from __future__ import annotations

from typing import Callable

from resultsdoc.entries import Data
from resultsdoc.formatting import GB, mem, n0, ratio

THROUGHPUT_ROWS = (("ours", "fast spec, recipe defaults"), ("megatron_local", "Megatron local spec"),
                   ("hf_eager", "transformers loop, eager SDPA"), ("hf_compile", "transformers + torch.compile"))


def batch_of(d: Data, model: str) -> str:
    b = d["batch"][model]
    return f"micro batch {b['micro_batch']} × {b['micro_batches']}"


def throughput_caption(d: Data) -> str:
    steps = len(d["results"]["qwen3_1p7b"]["ours"]["losses"])
    return (f"seq {d['seq_length']}, {steps} steps, median of steps 4–{steps}. Fast spec with the recipe defaults "
            "(whole-step CUDA graph, fused weight-gradient accumulation, chunked loss). A step is timed from the "
            "previous step's end, as the transformers loop is. Peak memory in GB (10⁹ bytes). The qwen3_1p7b fast "
            "spec and transformers + compile rows ran in one process (the row_files field); compare rows of one "
            "file only.")


def throughput_header(models: tuple[str, ...]) -> Callable[[Data], list[str]]:
    return lambda d: ["tokens/s/GPU (peak memory)", *(f"{m}, {batch_of(d, m)}" for m in models)]


def throughput_rows(d: Data) -> list[list[str]]:
    models = ("qwen3_1p7b", "gpt_smoke")
    rows = []
    for impl, label in THROUGHPUT_ROWS:
        cells = []
        for model in models:
            row = d["results"][model][impl]
            if impl == "ours":
                cells.append(f"**{n0(row['tokens_per_s'])}** ({row['tflops']:.0f} TFLOP/s; "
                             f"{mem(row['peak_mem_gb'], GB)})")
            else:
                cells.append(f"{n0(row['tokens_per_s'])} ({mem(row['peak_mem_gb'], GB)})")
        rows.append([label, *cells])
    rows.append(["fast spec ÷ transformers + compile",
                 *(f"**{ratio(d['results'][m]['ours_vs_hf_compile'])}**" for m in models)])
    rows.append(["fast spec ÷ Megatron local spec", *(_ratio_or_reason(d["results"][m], "ours_vs_megatron_local")
                                                       for m in models)])
    return rows


def _ratio_or_reason(rows: Data, name: str) -> str:
    if name in rows:
        return ratio(rows[name])
    return f"not computed: {rows.get('ratios_not_computed', {}).get(name, 'no figure')}"


def fast_vs_local_one_run(d: Data) -> str:
    """The qwen3 ratio the table withdraws, measured in one process (rows run with TE hidden, as on a TE-less host)."""
    q = d["results"]["qwen3_1p7b"]
    fast, local = q["ours_without_te"], q["megatron_local_without_te"]
    return (f"qwen3_1p7b's fast ÷ local spec measured in one run (rev {d['revision']}, the same batch, both rows with "
            f"Transformer Engine hidden from their processes, as on this table's TE-less host): "
            f"**{ratio(fast['tokens_per_s'] / local['tokens_per_s'])}** ({n0(fast['tokens_per_s'])} against "
            f"{n0(local['tokens_per_s'])} tokens/s; peak {mem(fast['peak_mem_gb'], GB)} against "
            f"{mem(local['peak_mem_gb'], GB)})"
            + (f"; the local row's process {local['incomplete']}, its {local['timed_steps']} timed steps as many as "
               f"the fast spec's {fast['timed_steps']}" if "incomplete" in local else "")
            + ". The file's other rows: Transformer Engine section.")


def profile_graph(d: Data) -> str:
    tokens = d["micro_batch"] * d["micro_batches"] * d["seq_length"]
    return (f"{d['step']}: one graphed step of {n0(tokens)} tokens is {n0(d['kernels'])} kernels, "
            f"{d['kernel_ms']} ms of kernel time in a {d['kernel_span_ms']:.0f} ms span, gaps over 0.2 ms adding to "
            f"{d['gaps_over_0p2ms_total_ms']:.1f} ms; {d['step_ms_without_profiler']:.0f} ms without the profiler.")
