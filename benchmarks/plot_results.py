"""PNGs of committed GPU results, one figure per call:
- training results (benchmarks/results/*_train.json): loss and LR curves;
- stop/resume proofs (*_stop_resume*.json, tests/gpu/stop_resume.sh): the resumed and the uninterrupted
  run's losses after the restart, and |difference|.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = [(path, json.loads(path.read_text())) for path in args.results]
    stop_resume = ["compared_iterations" in res for _, res in results]
    if any(stop_resume) and not all(stop_resume):
        raise SystemExit("give either training results or stop/resume results, not both")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    (plot_stop_resume if all(stop_resume) else plot_training)(results, *axes)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
