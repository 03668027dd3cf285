"""Summarise a run's metrics.jsonl (written by RunMetricsCallback) into the results JSON committed
under benchmarks/results/: steps, throughput, model TFLOP/s, losses, peak memory, resume evidence.

usage: python benchmarks/train_report.py RUN_DIR --name NAME --command CMD --out FILE.json"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from kaiyuan_recipes.config.run_layout import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance, write_json  # noqa: E402


def segments(records: list[dict]) -> list[list[dict]]:
    """Split the record stream at each train_start: one segment per launch of the run."""
    out: list[list[dict]] = []
    for rec in records:
        if rec["event"] == "train_start":
            out.append([rec])
        elif out:
            out[-1].append(rec)
    return out


# Megatron's console line for a training iteration.
ITERATION_LINE = re.compile(r"iteration +(\d+)/ *\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+).*?"
                            r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+).*?lm loss: ([0-9.E+-]+)")


def megatron_iterations(log: Path) -> dict[int, tuple[float, float, float]]:
    """iteration -> (lm loss, ms per iteration, model TFLOP/s) from a Megatron console log."""
    return {int(m[1]): (float(m[4]), float(m[2]), float(m[3]))
            for m in ITERATION_LINE.finditer(log.read_text(errors="replace"))}


def tflops_from_logs(logs: list[Path]) -> float | None:
    """Megatron's own per-GPU model TFLOP/s from its iteration lines (first line of each launch
    dropped: it includes warm-up)."""
    values = []
    for log in logs:
        values.extend(v[2] for _, v in sorted(megatron_iterations(log).items())[1:])
    return statistics.median(values) if values else None


def report(run_dir: Path, name: str, command: str, logs: list[Path] = ()) -> dict:
    records = read_metrics(run_dir / "run_state")
    if not records:
        raise SystemExit(f"{run_dir}/run_state/metrics.jsonl: no records")
    segs = segments(records)
    steps = [r for r in records if r["event"] == "step"]
    # Steady state: drop each launch's first 3 steps (allocator warm-up, first checkpoint load).
    steady = [r for seg in segs for r in [x for x in seg if x["event"] == "step"][3:]]
    launches = []
    for seg in segs:
        seg_steps = [r for r in seg if r["event"] == "step"]
        launches.append(
            {
                "started_at_iteration": seg[0]["iteration"],
                "first_step": seg_steps[0]["iteration"] if seg_steps else None,
                "last_step": seg_steps[-1]["iteration"] if seg_steps else None,
                "checkpoints_saved": [r["iteration"] for r in seg if r["event"] == "checkpoint"],
            }
        )
    resumed_correctly = all(
        later["started_at_iteration"] == (earlier["checkpoints_saved"] or [None])[-1]
        and later["first_step"] == later["started_at_iteration"] + 1
        for earlier, later in zip(launches, launches[1:])
    )
    return {
        "name": name,
        **provenance(command),
        "steps": len(steps),
        "final_iteration": steps[-1]["iteration"],
        "tokens_per_s_per_gpu": statistics.median(r["tokens_per_s_per_gpu"] for r in steady) if steady else None,
        "model_tflops_per_gpu": (
            statistics.median(r["model_tflops_per_gpu"] for r in steady if r["model_tflops_per_gpu"])
            if any(r.get("model_tflops_per_gpu") for r in steady)
            else tflops_from_logs(list(logs))
        ),
        "first_loss": steps[0]["loss"],
        "last_loss": steps[-1]["loss"],
        "loss_fell": steps[-1]["loss"] < steps[0]["loss"],
        "peak_mem_gb": max((r["peak_mem_gb"] or 0) for r in steps),
        "launches": launches,
        "resumed_at_right_iteration": resumed_correctly if len(launches) > 1 else None,
        "loss_curve": [[r["iteration"], r["loss"]] for r in steps],
        "lr_curve": [[r["iteration"], r["lr"]] for r in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--log", type=Path, nargs="*", default=[], help="console logs of the launches")
    args = parser.parse_args()
    result = report(args.run_dir, args.name, args.command, args.log)
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_curve")}, indent=2))


if __name__ == "__main__":
    main()
