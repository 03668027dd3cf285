"""`kaiyuan train`: resolve, check and launch a recipe on this node."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.launch.lifecycle import run_in_foreground
from kaiyuan_recipes.launch.torchrun import TorchrunSpec
from kaiyuan_recipes.training.config import build_config
from kaiyuan_recipes.training.entry import prepare_run_dirs
from kaiyuan_recipes.training.run_logging import VERBOSE_ENV
from kaiyuan_recipes.training.summary import print_summary, summarize
from kaiyuan_recipes.training.validate import validate


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
    """A launch on this node, resolved and checked once: the config, the run's settings, the dry-run summary and
    the torchrun command. `kaiyuan train` runs the command; `kaiyuan start` hands it to its supervisor, which then
    launches without building the config again (the ranks build it: the model is built there)."""

    cfg: Any
    settings: Any
    summary: dict[str, Any]
    argv: list[str]


def checked_launch(recipe: str, overrides: list[str], nproc_per_node: int) -> CheckedLaunch:
    """Bad input fails here, in the launching process, before anything is started."""
    spec = TorchrunSpec(nproc_per_node=nproc_per_node)
    cfg, settings = build_config(recipe, overrides)
    layout = validate(cfg, settings, spec.world_size)
    argv = spec.argv(recipe, overrides)
    return CheckedLaunch(cfg, settings, summarize(cfg, settings, layout, argv), argv)


def run(args: Any) -> int:
    args.overrides = with_phase(args.phase, args.overrides)
    launch = checked_launch(args.recipe, args.overrides, args.nproc_per_node)
    cfg, settings, summary, argv = launch.cfg, launch.settings, launch.summary, launch.argv
    if args.dry_run:
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print_summary(summary)
        return 0
    prepare_run_dirs(settings)
    if getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # the ranks inherit it (training/run_logging.py)
    log_path = settings.layout.logs / f"train-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # SIGTERM -> the ranks save a checkpoint and exit; run_state/ records it for `kaiyuan status`
    code = run_in_foreground(settings.run_dir, argv, log_path,
                             {"recipe": args.recipe, "train_iters": cfg.train.train_iters, "foreground": True},
                             announce=f"launching: {summary['launch_command']}\nlog: {log_path}")
    # This process imported Megatron to resolve the config, and tearing that down takes seconds, during which the
    # run still counts as alive (a stop waits, a new start is refused): the run is over and recorded, so leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def plot(args: Any) -> int:
    from kaiyuan_recipes.training.plots import plot_runs

    for path in plot_runs(args.run_dirs, args.out):
        print(path)
    return 0
