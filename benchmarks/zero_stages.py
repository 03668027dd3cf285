"""[launch] §6: qwen3_1p7b data-parallel on 2 GPUs with ZeRO stage 0, 1 and 2 (kaiyuan.zero_stage: plain DDP,
distributed optimizer, distributed optimizer + sharded gradients) against the same per-GPU work on 1 GPU:
tokens/s/GPU, model TFLOP/s, peak memory per stage, and scaling efficiency = tokens/s/GPU on 2 GPUs divided by
tokens/s on 1. One GPU-host run (kind nvidia-h200-x2) writes the JSON and a bar chart beside it.

usage: python benchmarks/zero_stages.py --out zero_stages.json [--layer-spec fast] [--steps 12] [--run-timeout 150]
       [--variant NAME STAGE OVERRIDE...] [--only 1gpu 2gpu_NAME] [--micro-batch 4 --micro-batches 2]
       python benchmarks/zero_stages.py --out x.json --print-commands   (what it would run; any host)"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from merge_results import unfinished  # noqa: E402
from provenance import provenance, revision, this_command, write_json  # noqa: E402
from train_throughput import BATCH, megatron_command, megatron_run  # noqa: E402

MODEL = "qwen3_1p7b"
STAGES = (0, 1, 2)
# Every run runs the same step: the fast spec's whole-step CUDA graph and fused weight-gradient accumulation do
# not apply under ZeRO 2 (Megatron-FSDP), so they are off for all, the 1-GPU baseline included; so is the
# chunked cross-entropy unless --chunked-loss.
FULL_LOGITS = ("kaiyuan.chunked_loss=false",)
SAME_STEP = ("kaiyuan.cuda_graph=false", "kaiyuan.wgrad_fusion=false")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in results if "tokens_per_s" in results[k]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [results[k]["tokens_per_s"] for k in names], color="tab:blue")
    a.set_ylabel("tokens/s per GPU")
    for i, k in enumerate(names):
        if "scaling_efficiency" in results[k]:
            a.annotate(f"{100 * results[k]['scaling_efficiency']:.0f}%", (i, results[k]["tokens_per_s"]),
                       ha="center", va="bottom")
    b.bar(names, [results[k].get("peak_mem_gb") or 0 for k in names], color="tab:orange")
    b.set_ylabel("peak memory per GPU (GiB)")
    fig.suptitle(f"{MODEL}: ZeRO stages on 2 GPUs vs 1 GPU (same per-GPU batch)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def efficiency(row: dict, base: dict) -> None:
    """Scaling efficiency against the 1-GPU row, only when both finished and timed as many steps."""
    if not (row.get("tokens_per_s") and base.get("tokens_per_s")):
        return
    if reason := unfinished({"this row": row, "the 1gpu row": base}):
        row["scaling_efficiency_not_computed"] = reason
    elif row.get("timed_steps") != base.get("timed_steps"):
        row["scaling_efficiency_not_computed"] = (f"timed steps differ: {row.get('timed_steps')} here, "
                                                  f"{base.get('timed_steps')} on 1 GPU")
    else:
        row["scaling_efficiency"] = row["tokens_per_s"] / base["tokens_per_s"]


def baseline_row(path: Path, settings: dict) -> dict:
    """The 1gpu row of an earlier run of this script, refused unless it ran the same step at the same revision."""
    earlier = json.loads(path.read_text())
    if differ := {k: (earlier.get(k), v) for k, v in settings.items() if earlier.get(k) != v}:
        raise SystemExit(f"--baseline {path}: not the same run settings (file, this run): {differ}")
    if "tokens_per_s" not in earlier["results"].get("1gpu", {}):
        raise SystemExit(f"--baseline {path}: no measured 1gpu row")
    return earlier["results"]["1gpu"] | {"from_file": path.name}


def row_plan(args: argparse.Namespace, gpus: int, stage: int, extra: tuple[str, ...]) -> dict:
    """The one description of a row's training run: megatron_run(**plan) measures it and
    megatron_command(**plan, root=...) is the command that run executes (what --print-commands prints)."""
    same_step = (*(() if args.chunked_loss else FULL_LOGITS), *(() if args.recipe_step else SAME_STEP))
    return {"model": MODEL, "layer_spec": args.layer_spec, "mbs": args.micro_batch, "micro": args.micro_batches,
            "seq": args.seq, "steps": args.steps, "nproc": gpus,
            "extra": (f"kaiyuan.zero_stage={stage}", *same_step, *extra)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layer-spec", default="auto")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--run-timeout", type=float, default=None,
                    help="seconds per configuration; past it, that row records the timeout and the others still run")
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar=("NAME STAGE", "OVERRIDE"),
                    help="an extra 2-GPU row: a name, a ZeRO stage and overrides "
                         "(e.g. zero2_bf16_comm 2 ddp.megatron_fsdp_grad_comm_dtype=bf16)")
    ap.add_argument("--micro-batch", type=int, default=BATCH[MODEL][0])
    ap.add_argument("--micro-batches", type=int, default=BATCH[MODEL][1],
                    help="micro-batches per GPU and step: Megatron-FSDP reduce-scatters gradients after each one "
                         "under ZeRO 2 (its no_sync does not defer that), ZeRO 0/1 once a step")
    ap.add_argument("--only", nargs="+", metavar="ROW",
                    help="run these rows only (1gpu, 2gpu_zero0..2, 2gpu_<variant>); keep 1gpu for the scaling")
    ap.add_argument("--chunked-loss", action="store_true", help="every row with the chunked cross-entropy")
    ap.add_argument("--recipe-step", action="store_true",
                    help="every row with the recipe's own step (kaiyuan.cuda_graph / wgrad_fusion left at auto: on "
                         "at ZeRO 0/1, off at ZeRO 2) instead of both pinned off; the stages then differ in step")
    ap.add_argument("--baseline", type=Path, metavar="JSON",
                    help="the 1gpu row from this file of this script (same revision and settings; measured while "
                         "the other GPU ran something else) instead of measuring it again")
    ap.add_argument("--print-commands", action="store_true")
    args = ap.parse_args()
    mbs, micro = args.micro_batch, args.micro_batches
    runs = {"1gpu": (1, 1, ())} | {f"2gpu_zero{s}": (2, s, ()) for s in STAGES}
    for name, stage, *overrides in args.variant:
        if stage not in {str(s) for s in STAGES}:
            ap.error(f"--variant {name}: stage must be one of {STAGES}, got {stage!r}")
        runs[f"2gpu_{name}"] = (2, int(stage), tuple(overrides))
    if args.only:
        if unknown := sorted(set(args.only) - set(runs)):
            ap.error(f"--only: no row named {', '.join(unknown)}; the rows are {', '.join(runs)}")
        runs = {name: run for name, run in runs.items() if name in args.only}
    plans = {name: row_plan(args, gpus, stage, extra) for name, (gpus, stage, extra) in runs.items()}
    if args.print_commands:
        for name, plan in plans.items():
            print(name, shlex.join(megatron_command(**plan, root=Path("RUN_ROOT"))))
        return
    settings = {"model": MODEL, "seq_length": args.seq, "layer_spec": args.layer_spec, "micro_batch": mbs,
                "micro_batches_per_gpu": micro, "chunked_loss": args.chunked_loss, "recipe_step": args.recipe_step}
    results = {}
    if args.baseline:
        results["1gpu"] = baseline_row(args.baseline, {"revision": revision()} | settings)
        runs.pop("1gpu", None)
    for name, (gpus, stage, extra) in runs.items():
        measured = megatron_run(**plans[name], timeout=args.run_timeout)
        results[name] = measured | {"gpus": gpus, "zero_stage": stage} | ({"overrides": list(extra)} if extra else {})
        print(name, results[name], flush=True)
    for name in results:
        if name != "1gpu":
            efficiency(results[name], results.get("1gpu", {}))
    write_json(args.out, {**provenance(this_command()), **settings,
                          "target_scaling_efficiency": 0.95, "results": results})
    plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
