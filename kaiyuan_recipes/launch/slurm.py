"""The Slurm back-end of launch/run.py, through NeMo-Run's own SlurmExecutor (detached, as Megatron-Bridge's
scripts/training/setup_experiment.py launches): from the login node (LocalTunnel) or from a laptop (SSHTunnel),
with a container through Pyxis (`container_image`) or none. NeMo-Run writes and submits the sbatch script (one
srun step, one torchrun per node, `sbatch --requeue`); what this module adds is what a cluster user needs of it:

- `--signal=TERM@<grace>` without `B:`: Slurm signals the job step (every process of the srun tasks: torchrun
  and its ranks), not only the batch shell, so Megatron's exit-signal handler saves a checkpoint before the time
  limit. Slurm sends it up to ~60 s early (its time-limit check runs periodically).
- one log per node: the step's output goes to <run_dir>/logs/node<N>.log (`srun --output ...node%n.log`),
  appended across requeues, the same files the SSH back-end writes;
- a requeued or restarted job runs the same command in the same run directory, so training resumes from the
  latest checkpoint (training/config.py sets checkpoint.load to the run's checkpoints);
- the NCCL / GLOO interface variables of the launching shell are passed to the job (ssh.PASS_THROUGH_ENV).

status = sacct's State/ExitCode as run_state() words it (a job ended from outside is `lost`), with the last
exception in the node logs when it failed and the last iteration and checkpoint reached; stop = `scancel
--signal=TERM` (the ranks save), then `scancel` after the grace period (refused for a job that has ended);
logs = the node logs; all through the tunnel, as argument lists quoted with shlex. What the job asks of Slurm
is launch/slurm_spec.py (SlurmSpec, checked for the places of the script its values go). State:
run_state/slurm.json (config/run_layout.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.config.run_layout import LATEST_ITERATION_FILE, RunLayout
from kaiyuan_recipes.launch.failure import TAIL_BYTES, last_exception
from kaiyuan_recipes.launch.membership import sole_stop
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.slurm_spec import SlurmSpec, job_name, time_limit_seconds
from kaiyuan_recipes.launch.ssh import Node
from kaiyuan_recipes.launch.supervise import running_pid
from kaiyuan_recipes.run_states import ALIVE, RunState

# sacct's states of a job that has not ended, as `kaiyuan status` words them; the ended ones: run_state().
STATES = {**dict.fromkeys(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"), RunState.PENDING),
          **dict.fromkeys(("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"),
                          RunState.RUNNING)}
ACTIVE = (RunState.PENDING, RunState.RUNNING)


def run_state(slurm_state: str, stop_requested: bool) -> RunState:
    """A job's sacct State as the run's state. An ended job that `kaiyuan stop` asked to end is `stopped`
    (torchrun exits non-zero on that SIGTERM after the ranks saved; scancel after the grace gives CANCELLED).
    Otherwise COMPLETED is `finished` and FAILED (the job's own non-zero exit) `failed`; any other end came from
    outside the run (scancel by someone else, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL, DEADLINE):
    the run is `lost`, never `stopped` or `running`."""
    if slurm_state in STATES:
        return STATES[slurm_state]
    if stop_requested:
        return RunState.STOPPED
    return {"COMPLETED": RunState.FINISHED, "FAILED": RunState.FAILED}.get(slurm_state, RunState.LOST)


def metrics_records(text: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl tail (run_layout.read_metrics' format); a line cut by the tail or a kill
    is skipped."""
    records = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records

__all__ = ["ACTIVE", "STATES", "SlurmError", "SlurmRun", "SlurmSpec", "metrics_records", "require_known_host",
           "run_state", "time_limit_seconds"]


class SlurmError(RunError):
    pass


def require_known_host(node: Node, known_hosts: Path | None = None) -> None:
    """NeMo-Run's SSHTunnel (Fabric) would accept a login node's unknown host key unverified; the SSH back-end
    refuses one (launch/ssh.py), and so does this: the key must be in ~/.ssh/known_hosts (ssh there once)."""
    from paramiko import HostKeys

    path = known_hosts or Path.home() / ".ssh" / "known_hosts"
    keys = HostKeys(str(path)) if path.is_file() else HostKeys()
    name = node.host if node.port == 22 else f"[{node.host}]:{node.port}"
    if keys.lookup(name) is None:
        raise SlurmError(f"--tunnel ssh://{name}: its host key is not in {path}; connect once with ssh to check "
                         "and record it")


def _load_state(path: Path) -> tuple[SlurmSpec, dict[str, Any]]:
    try:
        saved = json.loads(path.read_text())
        names = {f.name for f in dataclass_fields(SlurmSpec)}
        if not (isinstance(saved, dict) and isinstance(saved.get("spec"), dict) and set(saved["spec"]) <= names
                and str(saved.get("job_id", "")).isdigit()):
            raise ValueError("expected {'spec': {...SlurmSpec fields}, 'job_id': digits, ...}")
        return SlurmSpec(**saved["spec"]), saved
    except (OSError, ValueError, TypeError) as err:
        raise SlurmError(f"{path}: not a Slurm job record written by `kaiyuan start --slurm` ({err})") from None


class SlurmRun(Run):
    """A run as a Slurm job; without `spec`, the one submitted from `run_dir` (its slurm.json)."""

    def __init__(self, run_dir: Path, spec: SlurmSpec | None = None):
        super().__init__(run_dir)
        self.record: dict[str, Any] = {}
        if spec is None:
            if not self.layout.slurm_state.is_file():
                raise SlurmError(f"{self.layout.slurm_state}: no Slurm job was submitted from here")
            spec, self.record = _load_state(self.layout.slurm_state)
        self.spec = spec
        self._tunnel: Any = None

    @property
    def cluster_layout(self) -> RunLayout:
        """The run directory on the cluster (where the job writes its logs and checkpoints)."""
        return RunLayout(Path(self.spec.cluster_run_dir or self.run_dir.resolve()))

    @property
    def job_id(self) -> str:
        return str(self.record.get("job_id", ""))

    def tunnel(self) -> Any:
        if self._tunnel is None:
            from kaiyuan_recipes.launch.slurm_executor import make_tunnel

            node = self.spec.ssh_node()
            if node is not None:
                require_known_host(node)
            self._tunnel = make_tunnel(self.spec, str(self.cluster_layout.run_dir / "nemo_run"))
        return self._tunnel

    def _on_cluster(self, argv: list[str], warn: bool = True) -> Any:
        return self.tunnel().run(shlex.join(argv), hide=True, warn=warn, in_stream=False)

    # -- submit ---------------------------------------------------------------------------------------------
    def _experiment(self) -> Any:
        import nemo_run as run

        return run.Experiment(f"kaiyuan-{self.name}", log_level="WARN")

    def _add(self, exp: Any, target: list[str]) -> None:
        from kaiyuan_recipes.launch.slurm_executor import slurm_executor, torchrun_task

        job_name(self.name)  # the #SBATCH --job-name NeMo-Run makes of it: a Slurm name
        # The log folder: made by start (on the cluster), never by a dry run.
        executor = slurm_executor(self.spec, str(self.cluster_layout.run_dir), make_log_folder=False)
        exp.add(torchrun_task(target), executor=executor, name=self.name)

    def sbatch_script(self, target: list[str]) -> str:
        """The sbatch script NeMo-Run would submit for `target` (nothing is submitted)."""
        exp = self._experiment()
        with exp:
            self._add(exp, target)
            exp.dryrun(log=False, delete_exp_dir=False)
            executor = exp.jobs[0].executor
            exp_dir = Path(executor.experiment_dir)
            script = (exp_dir / f"{executor.job_name}_sbatch.sh").read_text()
        shutil.rmtree(exp_dir, ignore_errors=True)  # a dry run leaves nothing behind
        with contextlib.suppress(OSError):
            exp_dir.parent.rmdir()
        return script

    def start(self, target: list[str], extra: dict[str, Any] | None = None) -> dict[int, int]:
        """Submit `target` (what torchrun runs on every node) detached; returns {0: Slurm job id}. Refused while
        the job this run directory submitted before is pending or running."""
        self.tunnel()  # an ssh:// login node with an unknown host key is refused before anything is made
        if self.layout.slurm_state.is_file():
            previous = SlurmRun(self.run_dir).status()
            if previous["state"] in ACTIVE:
                raise SlurmError(f"run {self.name!r} is already Slurm job {previous['job_id']} "
                                 f"({previous['slurm_state']}); stop it first")
        self._refuse_if_running_elsewhere()
        self.layout.stop_request.unlink(missing_ok=True)
        self.layout.state.mkdir(parents=True, exist_ok=True)
        self._on_cluster(["mkdir", "-p", str(self.cluster_layout.logs)], warn=False)
        exp = self._experiment()
        with exp:
            self._add(exp, target)
            exp.run(detach=True)
            handle = exp.jobs[0].handle
            experiment_id = exp._id
        job_id = handle.rstrip("/").rpartition("/")[2]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch gave no job id (NeMo-Run handle {handle!r})")
        self.record = {"spec": asdict(self.spec) | {"env": redacted_env(self.spec.env)}, "job_id": job_id,
                       "experiment_id": experiment_id, "target": target, **(extra or {})}
        write_text_atomic(self.layout.slurm_state, json.dumps(self.record, indent=2), mode=0o600)
        return {0: int(job_id)}

    def _refuse_if_running_elsewhere(self) -> None:
        """The same run directory trained by a run on this node or over SSH as well would interleave two
        trainings in one directory: refused while one of those is alive."""
        from kaiyuan_recipes.launch.ssh import MultiNodeRun

        if (pid := running_pid(self.layout.state)) is not None:
            raise SlurmError(f"run {self.name!r} is running on this node (supervisor pid {pid}); "
                             f"`kaiyuan stop {self.name}` first")
        if self.layout.multinode_state.is_file() and MultiNodeRun(self.run_dir).status()["state"] in ALIVE:
            raise SlurmError(f"run {self.name!r} is running on several nodes over SSH; `kaiyuan stop {self.name}` "
                             "first")

    # -- ask ------------------------------------------------------------------------------------------------
    def sacct(self) -> dict[str, str] | None:
        """The job's own sacct row (not its steps): State, ExitCode, NodeList, Elapsed, Reason; None before
        the accounting database has it."""
        res = self._on_cluster(["sacct", "-j", self.job_id, "-X", "--noheader", "--parsable2",
                                "--format=JobIDRaw,State,ExitCode,NodeList,Elapsed,Reason"])
        if res.exited != 0:
            raise SlurmError(f"sacct -j {self.job_id}: {(res.stderr or res.stdout).strip()[:300]}")
        for line in res.stdout.splitlines():
            cols = line.split("|")
            if len(cols) == 6 and cols[0] == self.job_id:
                return dict(zip(("job_id", "state", "exit_code", "nodes", "elapsed", "reason"), cols))
        return None

    def node_log(self, rank: int, lines: int = 200) -> str:
        res = self._on_cluster(["tail", "-n", str(int(lines)), str(self.cluster_layout.node_log(rank))])
        return res.stdout if res.exited == 0 else ""

    def progress(self) -> dict[str, Any]:
        """How far the job got: the last step's iteration and loss (the run's metrics.jsonl) and the newest
        checkpoint (Megatron's tracker file), read on the cluster; {} before the first of each."""
        layout = self.cluster_layout
        metrics = self._on_cluster(["tail", "-c", str(TAIL_BYTES), str(layout.metrics)])
        steps = [r for r in metrics_records(metrics.stdout if metrics.exited == 0 else "") if r.get("event") == "step"]
        tracker = self._on_cluster(["cat", str(layout.checkpoints / LATEST_ITERATION_FILE)])
        out: dict[str, Any] = {}
        if steps:
            out.update(iteration=steps[-1].get("iteration"), loss=steps[-1].get("loss"))
        if tracker.exited == 0 and tracker.stdout.strip().isdigit():
            out["last_checkpoint"] = int(tracker.stdout.strip())
        return out

    def status(self) -> dict[str, Any]:
        row = self.sacct()
        base = {"run": self.name, "backend": "slurm", "job_id": self.job_id}
        if row is None:  # submitted, not yet in the accounting database
            return base | {"state": RunState.PENDING, "slurm_state": "SUBMITTED"}
        slurm_state = row["state"].split()[0]  # "CANCELLED by 0" -> CANCELLED
        state = run_state(slurm_state, self.layout.stop_request.is_file())
        info = base | {"state": state, "slurm_state": slurm_state, "exit_code": row["exit_code"],
                       "nodes": row["nodes"], "elapsed": row["elapsed"]}
        if state == RunState.PENDING:
            info["reason"] = row["reason"]
        if state == RunState.FAILED:
            tails = [self._on_cluster(["tail", "-c", str(TAIL_BYTES), str(self.cluster_layout.node_log(r))]).stdout
                     for r in range(self.spec.nodes)]
            info["error"] = next((e for e in map(last_exception, tails) if e), None) or \
                f"Slurm: {slurm_state} (exit {row['exit_code']})"
        if state == RunState.LOST:
            info["error"] = (f"Slurm ended the job ({row['state']}, exit {row['exit_code']}) without a `kaiyuan "
                             "stop`; nothing of the run is alive")
        if state != RunState.PENDING:
            info |= {"train_iters": self.record.get("train_iters"), **self.progress()}
        return info

    # -- stop -----------------------------------------------------------------------------------------------
    def stop(self, grace: float = 300.0, poll: float = 2.0) -> dict[str, Any]:
        """SIGTERM to the job's step (its ranks save a checkpoint), then scancel after `grace` seconds if it is
        still running (or was requeued meanwhile). A pending job is cancelled at once; a job that has ended is
        refused (nothing is cancelled or recorded), and so is a stop while another is under way."""
        with sole_stop(self.layout, self.name):
            return self._stop(grace, poll)

    def _stop(self, grace: float, poll: float) -> dict[str, Any]:
        before = self.status()
        if before["state"] not in ACTIVE:  # nothing to signal, and no stop request to change what status says
            raise SlurmError(f"run {self.name!r} is not running: Slurm job {self.job_id} is {before['slurm_state']} "
                             f"({before['state']}); nothing cancelled")
        self.layout.state.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.layout.stop_request, json.dumps({"reason": "requested", "at": time.time(),
                                                                "grace_s": grace, "by_pid": os.getpid()}))
        state = before["state"]
        if state == RunState.RUNNING:
            self._on_cluster(["scancel", "--signal=TERM", self.job_id])
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and (state := self.status()["state"]) == RunState.RUNNING:
                time.sleep(poll)
        cancelled = state in ACTIVE
        if cancelled:
            res = self._on_cluster(["scancel", self.job_id])
            if res.exited != 0:
                raise SlurmError(f"scancel {self.job_id}: {(res.stderr or res.stdout).strip()[:300]}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.status()["state"] in ACTIVE:
                time.sleep(poll)
        return {"run": self.name, "sigkill_after_grace": cancelled and state == RunState.RUNNING, "grace_s": grace,
                **self.status()}

    def stop_problems(self, result: dict[str, Any]) -> list[str]:
        problems = []
        if result["sigkill_after_grace"]:
            problems.append(f"did not exit within {result['grace_s']:g}s of SIGTERM; cancelled (scancel)")
        if result["state"] in ACTIVE:
            problems.append(f"Slurm job {result['job_id']} is still {result['slurm_state']}")
        return problems

    def logs(self, follow: bool = False, out: TextIO | None = None) -> None:
        """The last 200 lines of each node's log; with `follow`, again every few seconds until the job ends."""
        out = sys.stdout if out is None else out
        seen = [0] * self.spec.nodes
        while True:
            for rank in range(self.spec.nodes):
                lines = self.node_log(rank, 100000 if follow else 200).splitlines(keepends=True)
                fresh = lines[seen[rank]:] if follow else lines
                if fresh:
                    out.write(f"==> node {rank} ({self.name}, Slurm job {self.job_id}) <==\n")
                    out.writelines(fresh)
                seen[rank] = len(lines)
            out.flush()
            if not follow or self.status()["state"] not in ACTIVE:
                return
            time.sleep(3)

    def stacks(self) -> str:
        raise SlurmError("stacks: not offered for Slurm jobs (a SIGUSR1 to the job step reaches torchrun too, "
                         "which it would kill); run py-spy dump on the node (srun --jobid "
                         f"{self.job_id} --overlap ...)")
