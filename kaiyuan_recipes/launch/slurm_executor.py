"""NeMo-Run's SlurmExecutor for a kaiyuan run, for `run.Experiment` / `run.run` and for SlurmRun (launch/slurm.py,
which also says what the job asks of Slurm and why):

    executor = slurm_executor(SlurmSpec(partition="batch", nodes=4, gpus_per_node=8), "/lustre/runs/exp")
    with run.Experiment("exp") as exp:
        exp.add(training_script("qwen3_1p7b", ["kaiyuan.run_root=/lustre/runs"]), executor=executor, name="exp")
        exp.run(detach=True)

(training_script: launch/nemo_run_executors.py). NeMo-Run writes and submits the sbatch script; only the step's
log name is changed here, to one file per node."""

from __future__ import annotations

import getpass
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nemo_run as run
from nemo_run.core.execution.slurm import SlurmJobDetails

from kaiyuan_recipes.compat.nemo_run import quote_srun_arguments
from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.slurm_spec import SlurmSpec, mount_path, one_line

__all__ = ["PerNodeLogs", "SlurmSpec", "make_tunnel", "slurm_executor", "torchrun_task"]


@dataclass(kw_only=True)
class PerNodeLogs(SlurmJobDetails):
    """NeMo-Run's job details (`folder`: the run's logs/), the srun step's output per node (srun's %n: the
    node's index in the job) as RunLayout.node_log names it, appended across requeues (open_mode)."""

    @property
    def srun_stdout(self) -> str:  # type: ignore[override]
        # NeMo-Run puts this path on the srun line as written (its own holds a shell expansion): quoted here.
        return shlex.quote(str(RunLayout(Path(self.folder).parent).node_log("%n")))


def make_tunnel(spec: SlurmSpec, job_dir: str) -> Any:
    """NeMo-Run's LocalTunnel (its experiment folder is the job's: NeMo-Run's home), or its SSHTunnel to the
    login node (NeMo-Run copies the experiment folder to `job_dir` there)."""
    node = spec.ssh_node()
    if node is None:
        return run.LocalTunnel(job_dir="")
    return run.SSHTunnel(host=node.host, user=node.user or getpass.getuser(), port=node.port,
                         identity=spec.identity_file, job_dir=job_dir)


def slurm_executor(spec: SlurmSpec, cluster_run_dir: str, make_log_folder: bool = True) -> Any:
    """NeMo-Run's SlurmExecutor for `spec`, the job's files in `cluster_run_dir` (NeMo-Run's under nemo_run/).
    Slurm fails a job whose log folder is missing: with `make_log_folder` it is made here (local tunnel only);
    SlurmRun makes it itself when it submits, so that a dry run makes nothing."""
    quote_srun_arguments()  # every srun argument below reaches the script shell-quoted
    layout = RunLayout(Path(one_line("--cluster-run-root", str(cluster_run_dir))))
    if make_log_folder and spec.ssh_node() is None:
        layout.logs.mkdir(parents=True, exist_ok=True)
    # The step's working directory: where `start` ran on the login node; over SSH, the run directory there.
    workdir = spec.workdir or (os.getcwd() if spec.ssh_node() is None else str(layout.run_dir))
    srun_args = [] if spec.container_image else ["--chdir", one_line("working directory", workdir)]
    # In a container the run directory is mounted at its own path, so checkpoints land where the logs are.
    run_dir = str(layout.run_dir)
    mounts = [*spec.container_mounts, f"{mount_path('--cluster-run-root', run_dir)}:{run_dir}"] \
        if spec.container_image else []
    return run.SlurmExecutor(
        account=spec.account, job_name_prefix="kaiyuan-", partition=spec.partition, nodes=spec.nodes,
        ntasks_per_node=spec.ranks_per_node, gpus_per_node=spec.gpus_per_node or None, time=spec.time,
        container_image=spec.container_image, container_mounts=mounts,
        signal=f"TERM@{spec.signal_grace_s}",
        # NeMo-Run writes `export K=V` into the script as it is (so that V may use the job's variables): quoted
        # here, a value arrives literally.
        env_vars={k: shlex.quote(v) for k, v in spec.env.items()}, srun_args=srun_args,
        tunnel=make_tunnel(spec, str(layout.run_dir / "nemo_run")), packager=run.Packager(),
        launcher="torchrun", retries=spec.retries, job_details=PerNodeLogs(folder=str(layout.logs)),
        poll_estimated_start_time=False)


def torchrun_task(target: list[str]) -> Any:
    """What torchrun runs, as a NeMo-Run Script: `-m module args…` or `script.py args…`."""
    if target[:1] == ["-m"] and len(target) > 1:
        return run.Script(path=target[1], args=list(target[2:]), m=True, entrypoint="python")
    if target and target[0].endswith(".py"):
        return run.Script(path=target[0], args=list(target[1:]), entrypoint="python")
    raise ValueError(f"slurm: runs Python under torchrun: expected ['-m', module, …] or [script.py, …], got {target}")


