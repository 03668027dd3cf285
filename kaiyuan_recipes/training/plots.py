"""`kaiyuan plot RUN_DIR…`: loss, learning rate, throughput and grad norm from the runs' TensorBoard
event files (what Megatron-Bridge writes to <run>/tb_logs), several runs overlaid, one PNG each."""

from __future__ import annotations

from pathlib import Path

from kaiyuan_recipes.config.run_layout import RunLayout

# PNG name -> (title, candidate TensorBoard tags, first found wins)
PANELS = {
    "loss": ("training loss", ("lm loss",)),
    "learning_rate": ("learning rate", ("learning-rate",)),
    "throughput": ("tokens/s per GPU", ("throughput/device/tokens_per_sec", "throughput/tokens_per_sec")),
    "grad_norm": ("gradient norm", ("grad-norm",)),
}


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = RunLayout(Path(run_dir)).tensorboard
    if not tb.is_dir():
        tb = Path(run_dir)
    if not any(tb.rglob("events.out.tfevents.*")):
        raise FileNotFoundError(f"{run_dir}: no TensorBoard event files (looked in {tb})")
    series: dict[str, list[tuple[int, float]]] = {}
    for events_dir in sorted({p.parent for p in tb.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            series.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(points) for tag, points in series.items()}


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {Path(r).name or str(r): read_scalars(Path(r)) for r in run_dirs}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, tags) in PANELS.items():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        drawn = 0
        for run, series in runs.items():
            tag = next((t for t in tags if t in series), None)
            if tag is None:
                continue
            steps, values = zip(*series[tag])
            ax.plot(steps, values, label=run, linewidth=1.2)
            drawn += 1
        if drawn:
            ax.set(title=title, xlabel="iteration")
            ax.grid(alpha=0.3)
            ax.legend()
            path = out_dir / f"{name}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            written.append(path)
        plt.close(fig)
    if not written:
        raise FileNotFoundError(f"none of {[t for _, ts in PANELS.values() for t in ts]} in {run_dirs}")
    return written
