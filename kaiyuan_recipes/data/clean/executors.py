"""Running the stages: datatrove's LocalPipelineExecutor one stage after the other on this machine, or its
SlurmPipelineExecutor as a chain of job arrays (each stage depends on the one before; finalize last). Both skip the
tasks whose completion marker exists, so a rerun after a kill does only what is missing; a task's outputs have fixed
names and are rewritten whole when it runs again, so nothing is written twice."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from kaiyuan_recipes.data.clean.manifest import RunPlan
from kaiyuan_recipes.data.clean.pipeline import Stage


class CleanRunError(RuntimeError):
    pass


@dataclass
class SlurmOptions:
    partition: str
    time: str = "24:00:00"
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    job_name: str = "kaiyuan-clean"
    wait: bool = False
    wait_timeout_s: float = 7 * 24 * 3600
    qos: str = ""


def finalize_stage(plan: RunPlan) -> Stage:
    from kaiyuan_recipes.data.clean.steps import FinalizeStep

    return Stage("finalize", [FinalizeStep(plan)], 1, ["finalize"])


_FORKS_DIE_WITH_US = False   # read in each forked child, as it was at the fork
_AT_FORK_REGISTERED = False


def _die_with_parent() -> None:
    """In a forked child: SIGKILL from the kernel when the thread that forked it dies (Linux; elsewhere nothing)."""
    if not _FORKS_DIE_WITH_US:
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the driver died before the prctl
        os._exit(1)


@contextmanager
def forks_die_with_this_process() -> Iterator[None]:
    """datatrove's LocalPipelineExecutor forks a multiprocess Manager, a server that runs until it is told to shut
    down, and a Pool. A driver killed outright (SIGKILL, the OOM killer) tells nobody: the Manager, holding a copy
    of the driver's memory, would stay behind. Processes forked while this is active die with the driver."""
    global _FORKS_DIE_WITH_US, _AT_FORK_REGISTERED
    if not _AT_FORK_REGISTERED:
        os.register_at_fork(after_in_child=_die_with_parent)
        _AT_FORK_REGISTERED = True
    _FORKS_DIE_WITH_US = True
    try:
        yield
    finally:
        _FORKS_DIE_WITH_US = False


def run_local(stages: list[Stage], plan: RunPlan, workers: int, log: Any = print) -> None:
    """Each stage with min(workers, its tasks) processes; a failed task stops the run with its error (completed
    tasks stay completed for the rerun)."""
    from datatrove.executor import LocalPipelineExecutor

    all_stages = stages + [finalize_stage(plan)]
    for number, stage in enumerate(all_stages, 1):
        n = max(1, min(workers, stage.tasks))
        log(f"stage {number}/{len(all_stages)}: {stage.name} ({stage.tasks} task(s), {n} at once)")
        executor = LocalPipelineExecutor(pipeline=stage.pipeline, tasks=stage.tasks, workers=n,
                                         logging_dir=plan.folder("logs", stage.name))
        with forks_die_with_this_process():
            executor.run()
        missing = executor.get_incomplete_ranks()
        if missing:
            raise CleanRunError(f"stage {stage.name}: task(s) {missing[:10]} did not complete; see "
                                f"{plan.folder('logs', stage.name, 'logs')}; a rerun resumes")


def _squeue(job_ids: list[str]) -> list[tuple[str, str, str]]:
    out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %r"], capture_output=True,
                         text=True, timeout=60)
    if out.returncode:
        # squeue refuses ids it no longer knows (all ended): nothing left in the queue
        return []
    return [tuple(line.split(None, 2)) + ("",) * (3 - len(line.split(None, 2)))  # type: ignore[misc]
            for line in out.stdout.splitlines() if line.strip()]


def submit_slurm(stages: list[Stage], plan: RunPlan, opts: SlurmOptions, log: Any = print) -> list[str]:
    """The chain of job arrays; returns their job ids (stages already complete submit nothing)."""
    from datatrove.executor import SlurmPipelineExecutor

    # The jobs run datatrove's launch_pickled_pipeline from this environment, with this environment's PYTHONPATH
    # (sbatch --export=ALL).
    env_command = f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\""
    previous = None
    executors = []
    for stage in stages + [finalize_stage(plan)]:
        executor = SlurmPipelineExecutor(
            pipeline=stage.pipeline, tasks=stage.tasks, time=opts.time, partition=opts.partition,
            cpus_per_task=opts.cpus_per_task, mem_per_cpu_gb=opts.mem_per_cpu_gb,
            job_name=f"{opts.job_name}-{stage.name}", qos=opts.qos, env_command=env_command,
            logging_dir=plan.folder("logs", stage.name), depends=previous, requeue=False,
            mail_type="NONE")
        executors.append(executor)
        previous = executor
    previous.run()  # launches its dependencies first
    ids = [str(e.job_id) for e in executors if e.job_id not in (None, -1)]
    log(f"submitted {len(ids)} Slurm job(s) ({', '.join(ids) or 'none: every stage is complete'}); "
        f"the output appears at {plan.output_dir} when the finalize job ends")
    return ids


def wait_slurm(job_ids: list[str], plan: RunPlan, opts: SlurmOptions, poll_s: float = 2.0) -> None:
    """Until the output directory appears; a failed stage (its dependents can then never start) is an error
    naming that stage's logs, and the dependents are cancelled."""
    manifest = Path(plan.output_dir) / "clean_manifest.json"
    deadline = time.monotonic() + opts.wait_timeout_s
    while time.monotonic() < deadline:
        if manifest.is_file():
            return
        queue = _squeue(job_ids) if job_ids else []
        if not queue:
            if manifest.is_file():
                return
            raise CleanRunError(f"the Slurm jobs {', '.join(job_ids)} ended without the output; see the logs under "
                                f"{plan.folder('logs')}; a rerun resumes")
        if all(state == "PENDING" and "DependencyNeverSatisfied" in reason for _, state, reason in queue):
            subprocess.run(["scancel", *[job for job, _, _ in queue]], capture_output=True, timeout=60)
            failed = [n for n in plan.stage_names if _incomplete(plan, n)]
            raise CleanRunError(f"Slurm stage {failed[0] if failed else '?'} failed; see "
                                f"{plan.folder('logs', failed[0] if failed else '')}; a rerun resumes")
        time.sleep(poll_s)
    raise CleanRunError(f"Slurm jobs {', '.join(job_ids)} still running after {opts.wait_timeout_s:g}s")


def _incomplete(plan: RunPlan, stage: str) -> bool:
    folder = Path(plan.folder("logs", stage))
    ranks = folder / "ranks_to_run.json"
    if not ranks.is_file():
        return True
    import json

    return any(not (folder / "completions" / f"{r:05d}").exists() for r in json.loads(ranks.read_text()))


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
