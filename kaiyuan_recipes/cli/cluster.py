"""`kaiyuan cluster up|down|check`: same-named containers on every host over SSH, and a cross-node
all-reduce check (kaiyuan_recipes.launch.cluster / .ssh)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kaiyuan_recipes.run_states import RunState


def add_ssh_arguments(p: Any, required: bool = True) -> None:
    p.add_argument("--hosts", required=required, help="comma-separated [user@]host[:port]; the first is the master")
    p.add_argument("--identity-file", help="SSH private key (default: the agent / ~/.ssh)")
    p.add_argument("--known-hosts", help="extra known_hosts file (unknown host keys are refused)")
    p.add_argument("--accept-unknown-hosts", action="store_true",
                   help="admit hosts with no key on record, with a warning, for this command only (a changed key is "
                        "still refused)")
    p.add_argument("--connect-timeout", type=float, default=15.0, help="seconds to reach a host over SSH")
    p.add_argument("--command-timeout", type=float, default=120.0,
                   help="seconds one remote command may take before its node is reported unreachable")


def spec_from(args: Any, **kw: Any):
    from kaiyuan_recipes.launch.ssh import MultiNodeSpec

    return MultiNodeSpec(nodes=[h for h in args.hosts.split(",") if h], identity_file=args.identity_file,
                         known_hosts=args.known_hosts, accept_unknown_hosts=args.accept_unknown_hosts,
                         connect_timeout=args.connect_timeout, command_timeout=args.command_timeout, **kw)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="bring the same-named container up / down on every host; check NCCL")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    up = csub.add_parser("up", help="docker run -d --gpus all --network=host --ipc=host --shm-size=64g on every host")
    add_ssh_arguments(up)
    up.add_argument("--container-name", required=True, help="the container's name, the same on every host")
    up.add_argument("--image", required=True, help="the image to run (pulled on each host if absent)")
    up.add_argument("--mount", action="append", default=[], help="HOST_PATH:CONTAINER_PATH (repeat)")
    up.add_argument("--shm-size", default="64g", help="docker run --shm-size (default 64g)")
    up.set_defaults(func=cluster_up)
    down = csub.add_parser("down", help="docker rm -f the container on every host")
    add_ssh_arguments(down)
    down.add_argument("--container-name", required=True, help="the container to remove on every host")
    down.set_defaults(func=cluster_down)
    check = csub.add_parser("check", help="all-reduce across every GPU of every host (torchrun over SSH)")
    add_ssh_arguments(check)
    check.add_argument("--container-name", help="run inside this container on every host (default: on the host)")
    check.add_argument("--nproc-per-node", type=int, default=8, help="ranks (GPUs) per host (default 8)")
    check.add_argument("--master-port", type=int, default=29500, help="torchrun's rendezvous port on the first host")
    check.add_argument("--backend", default="nccl", help="torch.distributed backend: nccl (GPUs) or gloo (CPU)")
    check.add_argument("--python", default="python", help="the Python on the hosts / in the container")
    check.add_argument("--workdir", default=".", help="directory the check runs in on every host (default: this one)")
    check.set_defaults(func=cluster_check)


def _report(results: list[dict[str, Any]]) -> int:
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["ok"] for r in results) else 1


def cluster_up(args: Any) -> int:
    from kaiyuan_recipes.launch.cluster import on_every_host, up_argv

    return _report(on_every_host(spec_from(args), up_argv(args.container_name, args.image, args.mount,
                                                          shm_size=args.shm_size)))


def cluster_down(args: Any) -> int:
    from kaiyuan_recipes.launch.cluster import down_argv, on_every_host

    return _report(on_every_host(spec_from(args), down_argv(args.container_name)))


def cluster_check(args: Any) -> int:
    from kaiyuan_recipes.launch.ssh import MultiNodeRun

    spec = spec_from(args, nproc_per_node=args.nproc_per_node, master_port=args.master_port,
                     container=args.container_name, python=args.python, workdir=str(Path(args.workdir).resolve()))
    with tempfile.TemporaryDirectory(prefix="kaiyuan-cluster-check-") as work:
        job = MultiNodeRun(Path(work), spec)
        job.start(["-m", "kaiyuan_recipes.launch.allreduce_check", "--backend", args.backend])
        status = job.watch(poll=1.0, grace=30)
        for node in status["nodes"]:
            print(job.node_log(node["rank"], 50).strip() or f"rank {node['rank']}: no output", file=sys.stderr)
    print(json.dumps({k: v for k, v in status.items() if k != "nodes"} | {"nodes": [
        {k: n.get(k) for k in ("rank", "host", "state")} for n in status["nodes"]]}))
    return 0 if status["state"] == RunState.FINISHED else 1
