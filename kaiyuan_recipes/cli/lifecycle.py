"""`kaiyuan start | stop | status | logs | stacks`: start picks the back-end from its flags (--slurm: a Slurm
job, cli/slurm.py; --hosts: one torchrun per host over SSH; else this node); the other verbs open the run's
handle from its directory (kaiyuan_recipes.launch.backends.open_run) and ask it."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

from kaiyuan_recipes.cli.cluster import add_ssh_arguments, spec_from
from kaiyuan_recipes.cli.slurm import add_slurm_arguments, start_slurm

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def add_parser(sub: Any) -> None:
    from kaiyuan_recipes.run_states import RunState

    p = sub.add_parser("start", help="start a run detached (refused if that run is running)")
    p.add_argument("recipe", help="a recipe under recipes/ (kaiyuan models list), e.g. gpt_smoke")
    p.add_argument("run_name", help="the run's directory name under kaiyuan.run_root (letters, digits, . _ -)")
    p.add_argument("overrides", nargs="*", help="section.field=value, as for `kaiyuan train`")
    p.add_argument("--nproc-per-node", type=int, help="ranks per node (default 1; on Slurm: --gpus-per-node)")
    p.add_argument("--phase", type=int,
                   help="train phase N of kaiyuan.curriculum (default kaiyuan_2b), resuming phase N-1")
    p.add_argument("--verbose", action="store_true", help="every upstream log record on the console too")
    multi = p.add_argument_group("multi-node (one torchrun per host over SSH)")
    add_ssh_arguments(multi, required=False)
    multi.add_argument("--container-name", help="run inside this same-named container on every host (docker exec)")
    multi.add_argument("--master-port", type=int, default=29500, help="torchrun's rendezvous port on the first host")
    multi.add_argument("--python", default="python", help="the Python on the hosts / in the container")
    add_slurm_arguments(p.add_argument_group("Slurm (a job through NeMo-Run's SlurmExecutor)"))
    p.set_defaults(func=start)
    for name, helptext in (("stop", "SIGTERM the run's ranks, wait for the checkpoint, SIGKILL after --grace"),
                           ("status", f"{' / '.join(RunState)}, the phase, iteration, loss, throughput, ETA"),
                           ("logs", "the run's console log"),
                           ("stacks", "every rank's Python stacks now (where a stalled run waits)")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("run_name", nargs="?" if name == "status" else None,
                       help="the run's directory name under --run-root" + (" (default: every run)"
                                                                         if name == "status" else ""))
        q.add_argument("--run-root", type=Path, default=Path("./runs"),
                       help="the directory holding the runs (kaiyuan.run_root; default ./runs)")
        if name == "stop":
            q.add_argument("--grace", type=float, default=300.0,
                           help="seconds to wait for the checkpoint after SIGTERM before SIGKILL (default 300)")
        if name == "logs":
            q.add_argument("-f", "--follow", action="store_true", help="keep printing as the log grows, until the "
                                                                       "run ends")
        q.set_defaults(func={"stop": stop, "status": status, "logs": logs, "stacks": stacks}[name])


def checked_run_name(name: str) -> str:
    """One check for every verb: a run name is a plain directory name under the run root."""
    if not RUN_NAME.fullmatch(name or ""):
        raise ValueError(f"run name {name!r}: use letters, digits, '.', '_' and '-' only "
                         "(not starting with '.' or '-')")
    if len(name) > 128:  # a directory name (and its files') must fit the file system's 255 bytes
        raise ValueError(f"run name {name[:32]!r}... is {len(name)} characters long: at most 128")
    return name


def start(args: Any) -> int:
    from kaiyuan_recipes.cli.train import with_phase
    from kaiyuan_recipes.config.launch_request import check_launch_request

    checked_run_name(args.run_name)
    overrides = [*with_phase(args.phase, args.overrides), f"kaiyuan.run_name={args.run_name}"]
    if args.slurm and args.hosts:
        raise ValueError("--slurm and --hosts: choose one back-end")
    if not (args.slurm or args.hosts):
        if args.dry_run:
            raise ValueError(f"--dry-run: only with --slurm (it prints the sbatch script) or --hosts; for this node: "
                             f"kaiyuan train {args.recipe} --dry-run")
        return start_here(args, overrides)
    # Launching elsewhere (Slurm, SSH), this host does not train and imports no Megatron: it refuses what it can
    # decide in a moment; the training node's rank 0 resolves the plan (every `auto` decided for its hardware).
    request = check_launch_request(args.recipe, overrides)
    if args.slurm:
        return start_slurm(args, overrides, request)
    return start_multinode(args, overrides, request)


def start_here(args: Any, overrides: list[str]) -> int:
    """On this node: what can be refused in a moment is refused here (cli/train.py checked_launch), before the run
    is claimed; the supervisor then runs torchrun, and rank 0 resolves the run's plan once. What only that
    resolution can refuse ends the run before its first step, the reason in `kaiyuan logs` and `kaiyuan status`."""
    import os

    from kaiyuan_recipes.cli.train import checked_launch
    from kaiyuan_recipes.launch import foreground
    from kaiyuan_recipes.launch.lifecycle import LocalRun
    from kaiyuan_recipes.training.run_logging import VERBOSE_ENV

    launch = checked_launch(args.recipe, overrides, args.nproc_per_node or 1)
    request = launch.request
    request.layout.make_dirs()
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # the supervisor, torchrun and the ranks inherit it
    pids = LocalRun(request.run_dir).start(foreground.command(request.run_dir, launch.argv),
                                           {"recipe": args.recipe, "train_iters": request.train_iters})
    print(f"started {args.run_name} (supervisor pid {pids[0]}); it resolves its plan before the first step: "
          f"kaiyuan status {args.run_name}, kaiyuan logs {args.run_name} -f", flush=True)
    return 0


def start_multinode(args: Any, overrides: list[str], request: Any) -> int:
    import os

    from kaiyuan_recipes.config.plan_file import node_decides_note
    from kaiyuan_recipes.launch.ssh import MultiNodeRun
    from kaiyuan_recipes.launch.torchrun import ENTRY_MODULE

    spec = spec_from(args, nproc_per_node=args.nproc_per_node or 1, master_port=args.master_port,
                     container=args.container_name, python=args.python, workdir=os.getcwd())
    request.parallel_layout(spec.torchrun(0).world_size)
    if args.dry_run:
        print(node_decides_note(request.knobs.layer_spec, request.run_dir), file=sys.stderr)
        for rank, node in enumerate(spec.nodes):
            print(f"node {rank} ({node.host}): {shlex.join(spec.torchrun(rank).argv(args.recipe, overrides))}")
        return 0
    pids = MultiNodeRun(request.run_dir, spec).start(["-m", ENTRY_MODULE, args.recipe, *overrides])
    print(f"started {args.run_name} on {len(pids)} node(s): {', '.join(n.host for n in spec.nodes)}; "
          f"kaiyuan status {args.run_name} --run-root {request.run_dir.parent}")
    return 0


def stop(args: Any) -> int:
    from kaiyuan_recipes.config.run_layout import dumps_record
    from kaiyuan_recipes.launch.backends import open_run

    run = open_run(args.run_root / checked_run_name(args.run_name))
    result = run.stop(grace=args.grace)
    problems = run.stop_problems(result)
    for problem in problems:
        print(f"{args.run_name}: {problem}", file=sys.stderr)
    print(dumps_record(result))
    return 1 if problems else 0


def status(args: Any) -> int:
    """One JSON line per run. Every run is listed: one whose state cannot be read gets a line with its error
    (naming the file) and the exit code 1, and the others are still shown."""
    from kaiyuan_recipes.config.run_layout import RunLayout, dumps_record
    from kaiyuan_recipes.launch.backends import open_run
    from kaiyuan_recipes.launch.run import RunError

    if args.run_name is not None:
        run_dir = args.run_root / checked_run_name(args.run_name)
        print(dumps_record(with_plan(open_run(run_dir).status(), run_dir), ensure_ascii=False))
        return 0
    if not args.run_root.is_dir():  # an empty listing would read as "no runs"
        raise FileNotFoundError(f"{args.run_root}: the run root does not exist (--run-root)")
    failed = 0
    for run_dir in RunLayout.run_dirs_under(args.run_root):
        try:
            print(dumps_record(with_plan(open_run(run_dir).status(), run_dir), ensure_ascii=False), flush=True)
        except (RunError, OSError, ValueError) as err:
            failed += 1
            print(dumps_record({"run": run_dir.name, "state": "unreadable", "error": str(err)}, ensure_ascii=False),
                  flush=True)
    return 1 if failed else 0


def with_plan(status: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A run's status with its resolved plan (run_state/plan.json, briefly), once a launch has written it."""
    from kaiyuan_recipes.config.plan_file import plan_brief, read_plan

    record = read_plan(run_dir)
    return status if record is None else {**status, "plan": plan_brief(record)}


def logs(args: Any) -> int:
    from kaiyuan_recipes.launch.backends import open_run

    open_run(args.run_root / checked_run_name(args.run_name)).logs(follow=args.follow)
    return 0


def stacks(args: Any) -> int:
    from kaiyuan_recipes.launch.backends import open_run

    print(open_run(args.run_root / checked_run_name(args.run_name)).stacks(), end="")
    return 0
