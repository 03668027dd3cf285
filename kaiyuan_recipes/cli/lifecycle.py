"""`kaiyuan start | stop | status | logs | stacks`: detached runs on this node (kaiyuan_recipes.launch.lifecycle)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from kaiyuan_recipes.cli.cluster import add_ssh_arguments, spec_from


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("start", help="start a run detached (refused if that run is running)")
    p.add_argument("recipe")
    p.add_argument("run_name")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--nproc-per-node", type=int, default=1)
    multi = p.add_argument_group("multi-node (one torchrun per host over SSH)")
    add_ssh_arguments(multi, required=False)
    multi.add_argument("--container-name", help="run inside this same-named container on every host (docker exec)")
    multi.add_argument("--master-port", type=int, default=29500)
    multi.add_argument("--python", default="python", help="the Python on the hosts / in the container")
    p.set_defaults(func=start)
    for name, helptext in (("stop", "SIGTERM the run's process group, wait for the checkpoint, SIGKILL after --grace"),
                           ("status", "running / finished / failed (why) / stopped, iteration, loss, throughput, ETA"),
                           ("logs", "the run's console log"),
                           ("stacks", "every rank's Python stacks now (where a stalled run waits)")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("run_name", nargs="?" if name == "status" else None)
        q.add_argument("--run-root", type=Path, default=Path("./runs"))
        if name == "stop":
            q.add_argument("--grace", type=float, default=300.0)
        if name == "logs":
            q.add_argument("-f", "--follow", action="store_true")
        q.set_defaults(func={"stop": stop, "status": status, "logs": logs, "stacks": stacks}[name])


def checked_run_name(name: str) -> str:
    """One check for every verb: a run name is a plain directory name under the run root."""
    if not RUN_NAME.fullmatch(name or ""):
        raise ValueError(f"run name {name!r}: use letters, digits, '.', '_' and '-' only (not starting with '.' or '-')")
    return name


def start(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import start as start_run
    from kaiyuan_recipes.launch.torchrun import TorchrunSpec
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import validate

    checked_run_name(args.run_name)
    overrides = [*args.overrides, f"kaiyuan.run_name={args.run_name}"]
    cfg, run = build_config(args.recipe, overrides)  # bad input fails here, before anything starts
    if args.hosts:
        return start_multinode(args, overrides, cfg, run)
    validate(cfg, TorchrunSpec(nproc_per_node=args.nproc_per_node).world_size, run.max_positions)
    argv = [sys.executable, "-m", "kaiyuan_recipes.cli.main", "train", args.recipe,
            f"--nproc-per-node={args.nproc_per_node}", *overrides]
    pid = start_run(run.run_dir, argv, {"recipe": args.recipe, "train_iters": cfg.train.train_iters})
    print(f"started {args.run_name} (supervisor pid {pid}); logs: kaiyuan logs {args.run_name} -f")
    return 0


def start_multinode(args: Any, overrides: list[str], cfg: Any, run: Any) -> int:
    import os

    from kaiyuan_recipes.launch.ssh import MultiNodeJob
    from kaiyuan_recipes.launch.torchrun import ENTRY_MODULE
    from kaiyuan_recipes.training.validate import validate

    spec = spec_from(args, nproc_per_node=args.nproc_per_node, master_port=args.master_port,
                     container=args.container_name, python=args.python, workdir=os.getcwd())
    validate(cfg, spec.torchrun(0).world_size, run.max_positions)
    pids = MultiNodeJob(run.run_dir, spec).start(["-m", ENTRY_MODULE, args.recipe, *overrides])
    print(f"started {args.run_name} on {len(pids)} node(s): {', '.join(n.host for n in spec.nodes)}; "
          f"kaiyuan status {args.run_name} --run-root {run.run_dir.parent}")
    return 0


def multinode_job(run_dir: Path):
    from kaiyuan_recipes.launch.ssh import MultiNodeJob

    return MultiNodeJob(run_dir) if (run_dir / "run_state" / "multinode.json").is_file() else None


def stop(args: Any) -> int:
    checked_run_name(args.run_name)
    from kaiyuan_recipes.launch.lifecycle import stop as stop_run

    if (job := multinode_job(args.run_root / args.run_name)) is not None:
        result = job.stop(grace=args.grace)
        for node in result["unreachable"]:
            print(f"{args.run_name}: node {node['rank']} not stopped: {node['error']}", file=sys.stderr)
        print(json.dumps(result))
        return 1 if result["sigkill_after_grace"] or result["unreachable"] else 0
    result = stop_run(args.run_root / args.run_name, grace=args.grace)
    if result["sigkill_after_grace"]:
        print(f"{args.run_name}: did not exit within {args.grace:g}s of SIGTERM; sent SIGKILL", file=sys.stderr)
    print(json.dumps(result))
    return 1 if result["sigkill_after_grace"] else 0


def status(args: Any) -> int:
    from kaiyuan_recipes.launch.lifecycle import status as run_status

    runs = [args.run_root / checked_run_name(args.run_name)] if args.run_name is not None else sorted(
        p.parent for p in args.run_root.glob("*/run_state"))
    for run_dir in runs:
        job = multinode_job(run_dir)
        print(json.dumps(job.status() if job else run_status(run_dir)))
    return 0


def logs(args: Any) -> int:
    checked_run_name(args.run_name)
    from kaiyuan_recipes.launch.lifecycle import follow_log

    if (job := multinode_job(args.run_root / args.run_name)) is not None:
        for rank in range(len(job.spec.nodes)):
            print(f"==> node {rank} ({job.spec.nodes[rank].host}) <==")
            print(job.logs(rank, 200), end="")
        return 0
    follow_log(args.run_root / args.run_name, args.follow)
    return 0


def stacks(args: Any) -> int:
    checked_run_name(args.run_name)
    from kaiyuan_recipes.launch.stacks import dump_stacks, report

    if (job := multinode_job(args.run_root / args.run_name)) is not None:
        for rank, node in enumerate(job.spec.nodes):
            print(f"==> node {rank} ({node.host}) <==")
            print(job.stacks(rank), end="")
        return 0
    print(report(*dump_stacks(args.run_root / args.run_name)), end="")
    return 0
