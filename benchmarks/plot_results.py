"""Loss and LR curves of the committed GPU training results (benchmarks/results/*_train.json),
one PNG: python benchmarks/plot_results.py benchmarks/results/*_train.json --out benchmarks/results/train_curves.png"""

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
    fig, (loss_ax, lr_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    for path in args.results:
        res = json.loads(path.read_text())
        label = f"{res['name']} ({res['tokens_per_s_per_gpu'] / 1e3:.1f}k tok/s)"
        for ax, key in ((loss_ax, "loss_curve"), (lr_ax, "lr_curve")):
            points = [(i, v) for i, v in res.get(key, []) if v is not None]
            if points:
                ax.plot(*zip(*points), label=label, linewidth=1.2)
        for launch in res.get("launches", [])[1:]:
            loss_ax.axvline(launch["started_at_iteration"], color="grey", linestyle=":", linewidth=0.8)
    loss_ax.set(title="training loss (dotted: resumed from a checkpoint)", xlabel="iteration", yscale="log")
    lr_ax.set(title="learning rate", xlabel="iteration")
    for ax in (loss_ax, lr_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
