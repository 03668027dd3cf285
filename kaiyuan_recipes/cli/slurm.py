"""`kaiyuan start RECIPE RUN --slurm PARTITION ...`: the run as a Slurm job through NeMo-Run's SlurmExecutor
(kaiyuan_recipes.launch.slurm); stop / status / logs then find it from the run directory like any other run."""

from __future__ import annotations

from typing import Any


def add_slurm_arguments(p: Any) -> None:
    p.add_argument("--slurm", metavar="PARTITION", help="submit to this Slurm partition (sbatch through NeMo-Run)")
    p.add_argument("--nodes", type=int, default=1, help="nodes for the job (sbatch --nodes; default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="GPUs asked per node, one rank each (0 on a CPU partition: give --nproc-per-node)")
    p.add_argument("--account", help="Slurm account to charge (sbatch --account)")
    p.add_argument("--time", default="04:00:00", help="the job's time limit (sbatch --time)")
    p.add_argument("--container-image", help="run in this image through Pyxis (srun --container-image)")
    p.add_argument("--container-mount", action="append", default=[], help="SRC:DST for Pyxis (repeat)")
    p.add_argument("--tunnel", default="local",
                   help="'local' on the login node, or ssh://[user@]login[:port] from elsewhere (--identity-file)")
    p.add_argument("--cluster-run-root", help="the run root as the cluster sees it (needed with an ssh:// tunnel)")
    p.add_argument("--signal-grace", type=int, default=300,
                   help="seconds before the time limit that the ranks get SIGTERM to save (--signal=TERM@N)")
    p.add_argument("--retries", type=int, default=0, help="requeue a failed job this many times")
    p.add_argument("--dry-run", action="store_true",
                   help="print the sbatch script (--slurm) or each node's command (--hosts); start nothing")


def start_slurm(args: Any, overrides: list[str], request: Any) -> int:
    """`request`: the launch as the login host checked it (config/launch_request.py); the job's rank 0 resolves it."""
    from pathlib import PurePosixPath

    from kaiyuan_recipes.launch.slurm import SlurmRun, SlurmSpec
    from kaiyuan_recipes.launch.torchrun import ENTRY_MODULE

    cluster_root = args.cluster_run_root or str(request.run_dir.parent)
    spec = SlurmSpec(partition=args.slurm, nodes=args.nodes, gpus_per_node=args.gpus_per_node or None,
                     nproc_per_node=args.nproc_per_node, account=args.account, time=args.time,
                     container_image=args.container_image, container_mounts=args.container_mount,
                     tunnel=args.tunnel, identity_file=args.identity_file,
                     cluster_run_dir=str(PurePosixPath(cluster_root, args.run_name)) if args.cluster_run_root else None,
                     signal_grace_s=args.signal_grace, retries=args.retries)
    request.parallel_layout(spec.nodes * spec.ranks_per_node)
    # The job writes where the cluster sees the run directory (the same path on the login node).
    target = ["-m", ENTRY_MODULE, args.recipe, *overrides, f"kaiyuan.run_root={cluster_root}"]
    job = SlurmRun(request.run_dir, spec)
    if args.dry_run:
        import sys

        from kaiyuan_recipes.config.plan_file import node_decides_note

        print(node_decides_note(request.knobs.layer_spec, request.run_dir), file=sys.stderr)
        print(job.sbatch_script(target), end="")
        return 0
    job_id = job.start(target, {"recipe": args.recipe, "train_iters": request.train_iters})[0]
    print(f"submitted {args.run_name} as Slurm job {job_id} ({spec.nodes} node(s) x {spec.ranks_per_node}); "
          f"kaiyuan status {args.run_name} --run-root {request.run_dir.parent}")
    return 0
