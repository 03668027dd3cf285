"""PNGs of committed GPU results, one figure per call:
- training results (benchmarks/results/*_train.json): loss and LR curves;
- stop/resume proofs (*_stop_resume*.json, tests/gpu/stop_resume.sh): the resumed and the uninterrupted
  run's losses after the restart, and |difference|;
- training throughput (*_train_throughput*.json, benchmarks/train_throughput.py): tokens/s/GPU and peak
  memory per implementation, models side by side.
- pairs of same-seed runs (benchmarks/determinism_report.py: *_fast_vs_local*.json, *_tp2_fast_spec.json):
  both loss curves of each pair, and their relative difference against the 1 % line;
- serving under load (*_serve_load*.json, benchmarks/serve_load.py): each side's new tokens/s and latencies
  against the targets.
usage: python benchmarks/plot_results.py benchmarks/results/*_train.json --out benchmarks/results/train_curves.png
       python benchmarks/plot_results.py benchmarks/results/*_stop_resume*.json --out PNG"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_training(results: list[tuple[Path, dict]], loss_ax, lr_ax) -> None:
    for _, res in results:
        label = f"{res['name']} ({res['tokens_per_s_per_gpu'] / 1e3:.1f}k tok/s)"
        for ax, key in ((loss_ax, "loss_curve"), (lr_ax, "lr_curve")):
            points = [(i, v) for i, v in res.get(key, []) if v is not None]
            if points:
                ax.plot(*zip(*points), label=label, linewidth=1.2)
        for launch in res.get("launches", [])[1:]:
            loss_ax.axvline(launch["started_at_iteration"], color="grey", linestyle=":", linewidth=0.8)
    loss_ax.set(title="training loss (dotted: resumed from a checkpoint)", xlabel="iteration", yscale="log")
    lr_ax.set(title="learning rate", xlabel="iteration")


def plot_stop_resume(results: list[tuple[Path, dict]], loss_ax, diff_ax) -> None:
    for path, res in results:
        steps, losses = res["compared_iterations"], res["losses"]
        label = f"{path.stem} (rev {res['revision']}, resumed at {res['resumed_at_iteration']})"
        line, = loss_ax.plot(steps, losses["resumed"], label=f"resumed — {label}", linewidth=1.4)
        loss_ax.plot(steps, losses["reference"], color=line.get_color(), linestyle="--", linewidth=1,
                     label="uninterrupted, same seed")
        diffs = [abs(a - b) for a, b in zip(losses["resumed"], losses["reference"])]
        diff_ax.plot(steps, [d if d > 0 else 1e-9 for d in diffs], marker="o", markersize=3,
                     color=line.get_color(), label=f"{path.stem}: max {max(diffs):.3g}")
    loss_ax.set(title="loss after a graceful stop and restart", xlabel="iteration")
    diff_ax.set(title="|resumed - uninterrupted| (1e-9 = identical)", xlabel="iteration", yscale="log")


def plot_throughput(results: list[tuple[Path, dict]], tok_ax, mem_ax) -> None:
    rows = [(f"{model}\n{impl}", r) for _, res in results for model, impls in res["results"].items()
            for impl, r in impls.items() if isinstance(r, dict) and "tokens_per_s" in r]
    names = [name for name, _ in rows]
    tok_ax.barh(names, [r["tokens_per_s"] / 1e3 for _, r in rows], color="tab:blue")
    for i, (_, r) in enumerate(rows):
        tok_ax.annotate(f" {r['tokens_per_s'] / 1e3:.1f}k", (r["tokens_per_s"] / 1e3, i), va="center", fontsize=8)
    mem_ax.barh(names, [r.get("peak_mem_gb") or 0 for _, r in rows], color="tab:orange")
    tok_ax.set(title="training throughput (1 GPU, seq 4096)", xlabel="thousand tokens/s per GPU")
    mem_ax.set(title="peak memory", xlabel="GB")
    tok_ax.invert_yaxis()
    mem_ax.invert_yaxis()


def plot_pairs(results: list[tuple[Path, dict]], loss_ax, diff_ax) -> None:
    for path, res in results:
        for name, pair in res["results"].items():
            if "compared_at" not in pair:
                raise SystemExit(f"{path}: pair {name} has no compared_at (the iterations): written before the "
                                 "report recorded them; rerun benchmarks/determinism_report.py on its logs")
            steps = pair["compared_at"]
            line, = loss_ax.plot(steps, pair["loss_a"], linewidth=1.3, label=name)
            loss_ax.plot(steps, pair["loss_b"], color=line.get_color(), linestyle="--", linewidth=1)
            diff_ax.plot(steps, [100 * abs(x - y) / abs(x) for x, y in zip(pair["loss_a"], pair["loss_b"])],
                         color=line.get_color(), label=f"{name} (max {100 * pair['max_rel_loss_diff']:.1f} %)")
    diff_ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    loss_ax.set(title="loss, same seed and data: a_vs_b, solid a, dashed b", xlabel="iteration")
    diff_ax.set(title="|a - b| / a (%); dotted: 1 %", xlabel="iteration")


def plot_serve_load(results: list[tuple[Path, dict]], tok_ax, lat_ax) -> None:
    rows = [(f"{side} {res[side].get('revision') or (res['revision'] if side == 'ours' else '?')}", res[side]["load"])
            for _, res in results for side in ("ours", "baseline") if side in res]
    names = [name for name, _ in rows]
    tok_ax.barh(names, [load["tokens_per_s"] for _, load in rows], color="tab:blue")
    for i, (_, load) in enumerate(rows):
        tok_ax.annotate(f" {load['tokens_per_s']:,.0f}", (load["tokens_per_s"], i), va="center", fontsize=8)
    target = results[0][1]["targets"]
    tok_ax.axvline(target["tokens_per_s_at_least"], color="grey", linestyle=":", linewidth=1)
    tok_ax.set(title=f"new tokens/s, {results[0][1]['load']['clients']} clients (dotted: target)",
               xlabel="new tokens/s in aggregate")
    height = 0.27
    for k, (key, label) in enumerate([("p50", "latency p50"), ("p95", "latency p95"),
                                      ("first_p95", "streamed first token p95")]):
        values = [load["streamed_first_token_s"]["p95"] if key == "first_p95" else load["latency_s"][key]
                  for _, load in rows]
        lat_ax.barh([i + (k - 1) * height for i in range(len(rows))], values, height=height, label=label)
    lat_ax.set_yticks(range(len(rows)), names)
    lat_ax.axvline(target["p95_latency_s_at_most"], color="grey", linestyle=":", linewidth=1)
    lat_ax.set(title="latency (dotted: p95 target; of completed requests)", xlabel="seconds")
    tok_ax.invert_yaxis()
    lat_ax.invert_yaxis()


def kind_of(res: dict) -> str:
    if "load" in res and "targets" in res:
        return "serve_load"
    if "compared_iterations" in res:
        return "stop_resume"
    if isinstance(res.get("results"), dict) and all(isinstance(r, dict) and "loss_a" in r
                                                    for r in res["results"].values()):
        return "pairs"
    return "throughput" if isinstance(res.get("results"), dict) and "seq_length" in res else "training"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = [(path, json.loads(path.read_text())) for path in args.results]
    kinds = {kind_of(res) for _, res in results}
    if len(kinds) > 1:
        raise SystemExit(f"give results of one kind, not {sorted(kinds)}")
    kind = kinds.pop()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    {"stop_resume": plot_stop_resume, "throughput": plot_throughput, "training": plot_training,
     "pairs": plot_pairs, "serve_load": plot_serve_load}[kind](results, *axes)
    for ax in axes:
        ax.grid(alpha=0.3)
        if kind != "throughput" and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
