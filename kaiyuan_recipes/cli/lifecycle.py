"""`kaiyuan start | stop | status | logs`: detached runs on this node (kaiyuan_recipes.launch.lifecycle)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("start", help="start a run detached (refused if that run is running)")
    p.add_argument("recipe")
    p.add_argument("run_name")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.set_defaults(func=start)
    for name, helptext in (("stop", "SIGTERM the run's process group, wait for the checkpoint, SIGKILL after --grace"),
                           ("status", "running / finished / failed / stopped, iteration, loss, throughput, ETA"),
                           ("logs", "the run's console log")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("run_name", nargs="?" if name == "status" else None)
        q.add_argument("--run-root", type=Path, default=Path("./runs"))
        if name == "stop":
            q.add_argument("--grace", type=float, default=300.0)
        if name == "logs":
            q.add_argument("-f", "--follow", action="store_true")
        q.set_defaults(func={"stop": stop, "status": status, "logs": logs}[name])


def start(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import start as start_run
    from kaiyuan_recipes.launch.torchrun import TorchrunSpec
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import validate

    if not RUN_NAME.fullmatch(args.run_name):
        raise ValueError(f"run name {args.run_name!r}: use letters, digits, '.', '_' and '-' only")
    overrides = [*args.overrides, f"kaiyuan.run_name={args.run_name}"]
    cfg, run = build_config(args.recipe, overrides)  # bad input fails here, before anything starts
    validate(cfg, TorchrunSpec(nproc_per_node=args.nproc_per_node).world_size, run.max_positions)
    argv = [sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", args.recipe,
            f"--nproc-per-node={args.nproc_per_node}", *overrides]
    pid = start_run(run.run_dir, argv, {"recipe": args.recipe, "train_iters": cfg.train.train_iters})
    print(f"started {args.run_name} (supervisor pid {pid}); logs: kaiyuan logs {args.run_name} -f")
    return 0


def stop(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import stop as stop_run

    result = stop_run(args.run_root / args.run_name, grace=args.grace)
    if result["sigkill_after_grace"]:
        print(f"{args.run_name}: did not exit within {args.grace:g}s of SIGTERM; sent SIGKILL", file=sys.stderr)
    print(json.dumps(result))
    return 1 if result["sigkill_after_grace"] else 0


def status(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import status as run_status

    runs = [args.run_root / args.run_name] if args.run_name else sorted(
        p.parent for p in args.run_root.glob("*/run_state"))
    for run_dir in runs:
        print(json.dumps(run_status(run_dir)))
    return 0


def logs(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import follow_log

    follow_log(args.run_root / args.run_name, args.follow)
    return 0
