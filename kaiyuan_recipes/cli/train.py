"""`kaiyuan train`: resolve, check and launch a recipe on this node."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.config.launch_request import LaunchRequest, check_launch_request
from kaiyuan_recipes.data.on_this_host import refuse_data_missing_here
from kaiyuan_recipes.launch.host_checks import refuse_another_recipes_run, require_gpus
from kaiyuan_recipes.launch.lifecycle import run_in_foreground
from kaiyuan_recipes.launch.torchrun import TorchrunSpec
from kaiyuan_recipes.training.run_logging import VERBOSE_ENV


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train a recipe on this node with torchrun")
    p.add_argument("recipe", help="a recipe under recipes/ (kaiyuan models list), e.g. gpt_smoke")
    p.add_argument("overrides", nargs="*", help="section.field=value (Hydra syntax)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks (GPUs) on this node (default 1)")
    p.add_argument("--dry-run", action="store_true", help="resolve and print the plan; launch nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument("--phase", type=int,
                   help="train phase N of kaiyuan.curriculum (default kaiyuan_2b), resuming phase N-1")
    p.add_argument("--verbose", action="store_true",
                   help="every upstream log record on the console too (KAIYUAN_VERBOSE=1); always in logs/")
    p.set_defaults(func=run)
    pl = sub.add_parser("plot", help="PNGs of loss, LR, throughput and grad norm from runs' TensorBoard logs")
    pl.add_argument("run_dirs", nargs="+", type=Path, help="run directories (their tb_logs/); several: drawn together")
    pl.add_argument("--out", type=Path, default=Path("plots"), help="directory for the PNGs (default ./plots)")
    pl.set_defaults(func=plot)


def with_phase(phase: int | None, overrides: list[str]) -> list[str]:
    """`--phase N`: the overrides that train phase N of kaiyuan.curriculum (default kaiyuan_2b)."""
    if phase is None:
        return list(overrides)
    overrides = ["kaiyuan.data=curriculum", f"kaiyuan.phase={phase}"] + list(overrides)
    if not any(o.startswith("kaiyuan.curriculum=") for o in overrides):
        overrides.append("kaiyuan.curriculum=kaiyuan_2b")
    return overrides


@dataclass
class CheckedLaunch:
    """A launch on this node as this process checked it, and its torchrun command. Nothing here imports Megatron:
    the rank resolves the run's plan once (training/plan.py), and what only that resolution can refuse ends the run
    before its first step, with the reason on the console and in `kaiyuan status`."""

    request: LaunchRequest
    argv: list[str]


def checked_launch(recipe: str, overrides: list[str], nproc_per_node: int) -> CheckedLaunch:
    """Bad input that can be decided in a moment fails here, before anything is claimed or started."""
    spec = TorchrunSpec(nproc_per_node=nproc_per_node)
    request = check_launch_request(recipe, overrides)
    request.parallel_layout(spec.world_size)
    require_gpus(nproc_per_node)
    refuse_another_recipes_run(request.run_dir, recipe)
    # the ranks train here, so the data they will read must be here
    refuse_data_missing_here(request.knobs, request.value("dataset.blend"), request.value("dataset.blend_per_split"))
    return CheckedLaunch(request, spec.argv(recipe, overrides))


def stage(text: str) -> None:
    """A dry run's progress, on a terminal's stderr (its plan, on stdout, stays machine-readable with --json; a
    script reading stderr gets the error line alone)."""
    if sys.stderr.isatty():
        print(f"kaiyuan: {text}", file=sys.stderr, flush=True)


def dry_run(recipe: str, overrides: list[str], nproc_per_node: int, as_json: bool) -> int:
    """The full resolution a rank does, here, without training: every check of the launch."""
    spec = TorchrunSpec(nproc_per_node=nproc_per_node)
    t0 = time.monotonic()
    stage("building the config (a typo is refused before Megatron-Bridge is imported)")
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.summary import print_summary, summarize
    from kaiyuan_recipes.training.validate import validate

    cfg, settings = build_config(recipe, overrides)
    stage("checking the config")
    layout = validate(cfg, settings, spec.world_size)
    summary = summarize(cfg, settings, layout, spec.argv(recipe, overrides))
    stage(f"resolved in {time.monotonic() - t0:.1f} s")
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0


def run(args: Any) -> int:
    args.overrides = with_phase(args.phase, args.overrides)
    if args.dry_run:
        return dry_run(args.recipe, args.overrides, args.nproc_per_node, args.json)
    launch = checked_launch(args.recipe, args.overrides, args.nproc_per_node)
    request = launch.request
    request.layout.make_dirs()
    if getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # the ranks inherit it (training/run_logging.py)
    log_path = request.layout.logs / f"train-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # SIGTERM -> the ranks save a checkpoint and exit; run_state/ records it for `kaiyuan status`
    return run_in_foreground(request.run_dir, launch.argv, log_path,
                             {"recipe": args.recipe, "train_iters": request.train_iters, "foreground": True},
                             announce=f"launching: {shlex.join(launch.argv)}\nlog: {log_path}")


def plot(args: Any) -> int:
    from kaiyuan_recipes.training.plots import plot_runs

    for path in plot_runs(args.run_dirs, args.out):
        print(path)
    return 0
