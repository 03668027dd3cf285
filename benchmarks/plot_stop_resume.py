"""The stop/resume proofs (tests/gpu/stop_resume.sh results) as one PNG: per result, the losses of the
resumed run and the uninterrupted run over the 20 iterations after the resume, and |difference|.
usage: python benchmarks/plot_stop_resume.py benchmarks/results/*_stop_resume*.json --out PNG"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fig, (loss_ax, diff_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    for path in args.results:
        res = json.loads(path.read_text())
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
    for ax in (loss_ax, diff_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
