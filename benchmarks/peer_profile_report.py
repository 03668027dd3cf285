"""Where each profiled row's training step goes, side by side (e.g. `ours` against `torchtitan`), from the traces
`train_throughput.py --profile` keeps beside its results: per row the step's time on the GPU, time per kernel
family (kaiyuan_recipes.training.trace_breakdown), GPU busy share and idle gaps, host-side counts (kernels and
launch calls per step), and the model's FLOPs per step (the results' Megatron figure, the same for every row)
against a matrix peak: achieved TFLOP/s, and a table of where the rest of the step goes, which adds up to the
profiled step:
  model FLOPs at the peak | GEMM kernels' time beyond their FLOPs' at the peak | the same for attention (causal
  attention's FLOPs by Megatron's count, from the recipe's shape) | each other family's time | GPU idle
Time where kernels overlap (several streams) is split evenly between them, so nothing counts twice. The profiled
step runs under the profiler (its warm-up step before it), so it is somewhat slower than the timed steps; both
are given.

usage: python benchmarks/peer_profile_report.py --results peer_throughput.json --out peer_profile.json
       [--rows ours torchtitan] [--peak-tflops 790] [--png peer_profile.png]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import provenance, this_command, write_json  # noqa: E402

from kaiyuan_recipes.training.trace_breakdown import FAMILIES, read_trace_events, step_breakdown  # noqa: E402

# The dense bf16 matrix peak measured on H100s with large GEMMs (the default; --peak-tflops for another GPU).
DEFAULT_PEAK_TFLOPS = 790.0
ATTENTION_FAMILIES = ("attention fwd", "attention bwd")
AT_PEAK, GEMM_BELOW, ATTENTION_BELOW = ("model FLOPs at the matrix peak", "GEMM beyond its FLOPs at the peak",
                                        "attention beyond its FLOPs at the peak")
IDLE_SHORT, IDLE_LONG = "GPU idle: short gaps", "GPU idle: longer gaps, step start and end"
PARTS = (AT_PEAK, GEMM_BELOW, ATTENTION_BELOW, *(f for f in FAMILIES if f not in ("gemm", *ATTENTION_FAMILIES)),
         IDLE_SHORT, IDLE_LONG)


def flops_per_token(rows: dict) -> float:
    """Megatron's model FLOPs per token from the rows' own figures (train_throughput.py gives every row the
    figure of its Megatron row): `ours` first."""
    for name in ("ours", *rows):
        row = rows.get(name)
        if isinstance(row, dict) and row.get("tflops") and row.get("tokens_per_s"):
            return row["tflops"] * 1e12 / row["tokens_per_s"]
    raise ValueError("no row has tflops and tokens_per_s: give --flops-per-token")


def attention_flops_per_token(model: str, seq: int) -> float:
    """Causal self-attention's FLOPs per token (QK^T and AV; forward and the backward's two) as Megatron counts
    them: 6 * layers * seq * heads * head dim (half the full square: causal), from the recipe's model shape."""
    from kaiyuan_recipes.models.shape import ModelShape

    shape = ModelShape.for_recipe(model).fields
    head_dim = shape.get("kv_channels") or shape["hidden_size"] // shape["num_attention_heads"]
    return 6.0 * shape["num_layers"] * seq * shape["num_attention_heads"] * head_dim


def gap_table(breakdown: dict, flops_per_step: float, attention_flops_per_step: float,
              peak_tflops: float) -> list[dict]:
    """The profiled step split into PARTS (ms and share of the step); the parts add up to the step."""
    families = breakdown["families"]
    exposed = {f: families.get(f, {}).get("exposed_ms", 0.0) for f in FAMILIES}

    def at_peak(flops: float) -> float:
        return flops / (peak_tflops * 1e12) * 1e3

    idle = breakdown["idle"]
    ms = {AT_PEAK: at_peak(flops_per_step),
          GEMM_BELOW: exposed["gemm"] - at_peak(flops_per_step - attention_flops_per_step),
          ATTENTION_BELOW: sum(exposed[f] for f in ATTENTION_FAMILIES) - at_peak(attention_flops_per_step),
          **{f: exposed[f] for f in FAMILIES if f not in ("gemm", *ATTENTION_FAMILIES)},
          IDLE_SHORT: idle["short_gaps"]["ms"],
          IDLE_LONG: idle["long_gaps"]["ms"] + idle["before_first_activity_ms"] + idle["after_last_activity_ms"]}
    return [{"part": part, "ms": ms[part], "share": ms[part] / breakdown["step_ms"]} for part in PARTS]


def row_report(results_dir: Path, row: dict, tokens_per_step: int, flops_per_step: float,
               attention_flops_per_step: float, peak: float, gap_us: float) -> dict:
    trace = results_dir / row["profile"]["trace"]
    breakdown = step_breakdown(read_trace_events(trace), gap_us=gap_us)
    step_s = breakdown["step_ms"] / 1e3
    out = {"trace": row["profile"]["trace"], "profiled_step": row["profile"].get("step"), **breakdown,
           "tflops_profiled": flops_per_step / step_s / 1e12, "mfu_profiled": flops_per_step / step_s / 1e12 / peak}
    if row.get("tokens_per_s"):
        timed_s = tokens_per_step / row["tokens_per_s"]
        out |= {"step_ms_timed": timed_s * 1e3, "tflops_timed": flops_per_step / timed_s / 1e12,
                "mfu_timed": flops_per_step / timed_s / 1e12 / peak, "profiler_slowdown": step_s / timed_s}
    out["gap_to_peak"] = gap_table(breakdown, flops_per_step, attention_flops_per_step, peak)
    return out


def label(name: str, row: dict) -> str:
    timed = f", timed {row['step_ms_timed']:.0f} ms (MFU {100 * row['mfu_timed']:.0f}%)" if "mfu_timed" in row else ""
    return f"{name}\nprofiled {row['step_ms']:.0f} ms (MFU {100 * row['mfu_profiled']:.0f}%)\n{timed[2:]}"


def plot(report: dict, png: Path) -> None:
    """One stacked bar per row: the share of its profiled step each part of the gap table takes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["rows"])
    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(12, 2.2 + 0.9 * len(names)))
    for i, name in enumerate(names):
        left = 0.0
        for j, part in enumerate(report["rows"][name]["gap_to_peak"]):
            width = 100 * max(part["share"], 0.0)
            ax.barh(i, width, left=left, color=colors[j % len(colors)], label=part["part"] if i == 0 else None)
            if width >= 4:
                ax.text(left + width / 2, i, f"{width:.0f}", ha="center", va="center", fontsize=8)
            left += width
    labels = [label(n, report["rows"][n]) for n in names]
    ax.set_yticks(range(len(names)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"% of the profiled step (matrix peak {report['peak_tflops']:.0f} TFLOP/s)")
    ax.set_title(f"{report['model']}: where the step goes ({report.get('gpu') or 'GPU unknown'})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(names) < 3 else -0.2), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, required=True, help="train_throughput.py --profile's results file")
    ap.add_argument("--model", help="the model of the results to report (default: the first with a trace)")
    ap.add_argument("--rows", nargs="+", help="rows to report, in order (default: every row with a trace)")
    ap.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS,
                    help="the GPU's dense bf16 matrix peak (default: %(default)s, measured on H100s)")
    ap.add_argument("--flops-per-token", type=float, help="model FLOPs per token (default: the results' own)")
    ap.add_argument("--attention-flops-per-token", type=float,
                    help="of those, causal attention's (default: Megatron's count for the recipe's shape)")
    ap.add_argument("--gap-us", type=float, default=10.0,
                    help="idle gaps shorter than this count as launch gaps (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--png", type=Path, help="the bar chart (default: --out with .png)")
    args = ap.parse_args()
    results = json.loads(args.results.read_text())
    traced = {m: [n for n, r in rows.items() if isinstance(r, dict) and "trace" in (r.get("profile") or {})]
              for m, rows in results["results"].items()}  # a row's value, or a ratio between two rows
    model = args.model or next((m for m, names in traced.items() if names), None)
    if model not in traced or not traced[model]:
        raise SystemExit(f"{args.results}: no row of {model or 'any model'} has a profiler trace "
                         "(train_throughput.py --profile writes them)")
    rows = results["results"][model]
    names = args.rows or traced[model]
    missing = [n for n in names if n not in traced[model]]
    if missing:
        raise SystemExit(f"{args.results}: {model} rows without a trace: {missing} "
                         f"(with one: {traced[model]}; errors: "
                         f"{ {n: (rows.get(n) or {}).get('profile', {}).get('error') for n in missing
                              if isinstance(rows.get(n, {}), dict)} })")
    batch = results["batch"][model]
    tokens_per_step = batch["micro_batch"] * batch["micro_batches"] * results["seq_length"]
    fpt = args.flops_per_token or flops_per_token(rows)
    attention = (args.attention_flops_per_token if args.attention_flops_per_token is not None
                 else attention_flops_per_token(model, results["seq_length"]))
    report = {**provenance(this_command()), "gpu": (results.get("host") or {}).get("gpu"),
              "measured": {k: results.get(k) for k in ("command", "revision", "host", "date")},
              "results_file": args.results.name, "model": model, "tokens_per_step": tokens_per_step,
              "flops_per_token": fpt, "attention_flops_per_token": attention, "flops_per_step": fpt * tokens_per_step,
              "peak_tflops": args.peak_tflops,
              "rows": {n: row_report(args.results.parent, rows[n], tokens_per_step, fpt * tokens_per_step,
                                     attention * tokens_per_step, args.peak_tflops, args.gap_us) for n in names}}
    write_json(args.out, report)
    plot(report, args.png or args.out.with_suffix(".png"))
    width = max(len(p) for p in PARTS)
    print(f"{'ms per step':<{width}} " + " ".join(f"{n:>18}" for n in names))
    for i, part in enumerate(PARTS):
        cells = [report["rows"][n]["gap_to_peak"][i] for n in names]
        print(f"{part:<{width}} " + " ".join(f"{c['ms']:9.1f} ({100 * c['share']:4.1f}%)" for c in cells))
    print(f"{'step (profiled)':<{width}} " + " ".join(f"{report['rows'][n]['step_ms']:9.1f} ms      " for n in names))


if __name__ == "__main__":
    main()
