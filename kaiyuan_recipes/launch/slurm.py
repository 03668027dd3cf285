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

status = sacct's State/ExitCode (+ the last exception in the node logs when it failed), stop = `scancel
--signal=TERM` (the ranks save), then `scancel` after the grace period, logs = the node logs; all through the
tunnel, as argument lists quoted with shlex. State: run_state/slurm.json (run_layout.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.launch.failure import TAIL_BYTES, last_exception
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.ssh import PASS_THROUGH_ENV, Node
from kaiyuan_recipes.run_layout import RunLayout

# sacct's states, as `kaiyuan status` words them (anything not listed: "failed").
STATES = {"PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
          "RESV_DEL_HOLD": "pending", "RUNNING": "running", "COMPLETING": "running", "CONFIGURING": "running",
          "SUSPENDED": "running", "STAGE_OUT": "running", "SIGNALING": "running", "RESIZING": "running",
          "COMPLETED": "finished", "CANCELLED": "stopped"}
ACTIVE = ("pending", "running")


class SlurmError(RunError):
    pass


SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def time_limit_seconds(text: str) -> int:
    """sbatch --time in seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch's forms)."""
    match = SLURM_TIME.fullmatch(str(text).strip())
    if not match or str(text).strip() in ("0", ""):
        raise ValueError(f"--time {text!r}: expected MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:
        return (a * 60 + b) * 60 + c
    return a * 60 + (b or 0)  # MM or MM:SS


@dataclass
class SlurmSpec:
    partition: str
    nodes: int = 1
    gpus_per_node: int | None = 8  # asked of Slurm (--gpus-per-node); None on a CPU partition
    nproc_per_node: int | None = None  # ranks per node (torchrun); default: gpus_per_node
    account: str | None = None
    time: str = "04:00:00"
    container_image: str | None = None  # through Pyxis (srun --container-image); None: on the node itself
    container_mounts: list[str] = field(default_factory=list)
    tunnel: str = "local"  # "local" (on the login node) or ssh://[user@]host[:port] (from a laptop)
    identity_file: str | None = None  # the SSH key for an ssh:// tunnel
    cluster_run_dir: str | None = None  # the run directory as the cluster sees it; default: this one's path
    workdir: str | None = None  # the job's working directory (no container); default: where `start` ran
    # (local tunnel) or the cluster run directory (ssh://)
    signal_grace_s: int = 300  # SIGTERM to the ranks this long before the time limit (--signal=TERM@N)
    retries: int = 0  # NeMo-Run requeues a job that failed this many times (TORCHX_MAX_RETRIES)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.partition or self.partition.startswith("-"):
            raise ValueError(f"--slurm {self.partition!r}: expected a partition name")
        if self.nodes < 1 or (self.ranks_per_node < 1):
            raise ValueError(f"--nodes {self.nodes} / ranks per node {self.ranks_per_node}: expected at least 1 "
                             "(on a CPU partition: --gpus-per-node 0 --nproc-per-node N)")
        if self.signal_grace_s < 0 or self.retries < 0:
            raise ValueError("signal_grace_s and retries: expected >= 0")
        if self.signal_grace_s >= time_limit_seconds(self.time):  # Slurm would signal the ranks at once
            raise ValueError(f"--signal-grace {self.signal_grace_s}: expected fewer seconds than the time limit "
                             f"(--time {self.time})")
        self.ssh_node()  # checks an ssh:// tunnel's form
        if self.tunnel != "local" and not self.cluster_run_dir:
            raise ValueError(f"--tunnel {self.tunnel}: give --cluster-run-root (the run root on the cluster)")
        for key in PASS_THROUGH_ENV:
            if key in os.environ:
                self.env.setdefault(key, os.environ[key])

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 0

    def ssh_node(self) -> Node | None:
        if self.tunnel == "local":
            return None
        if not self.tunnel.startswith("ssh://"):
            raise ValueError(f"--tunnel {self.tunnel!r}: expected 'local' or ssh://[user@]host[:port]")
        return Node.parse(self.tunnel.removeprefix("ssh://"))


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

        executor = slurm_executor(self.spec, str(self.cluster_layout.run_dir))
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
            previous = SlurmRun(self.run_dir)
            if previous.status()["state"] in ACTIVE:
                raise SlurmError(f"run {self.name!r} is already Slurm job {previous.job_id} "
                                 f"({previous.status()['slurm_state']}); stop it first")
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

    def status(self) -> dict[str, Any]:
        row = self.sacct()
        base = {"run": self.name, "backend": "slurm", "job_id": self.job_id}
        if row is None:  # submitted, not yet in the accounting database
            return base | {"state": "pending", "slurm_state": "SUBMITTED"}
        slurm_state = row["state"].split()[0]  # "CANCELLED by 0" -> CANCELLED
        state = STATES.get(slurm_state, "failed")
        if state == "failed" and self.layout.stop_request.is_file():
            state = "stopped"  # torchrun exits non-zero on the SIGTERM of `kaiyuan stop`, after the ranks saved
        info = base | {"state": state, "slurm_state": slurm_state, "exit_code": row["exit_code"],
                       "nodes": row["nodes"], "elapsed": row["elapsed"]}
        if state == "pending":
            info["reason"] = row["reason"]
        if state == "failed":
            tails = [self._on_cluster(["tail", "-c", str(TAIL_BYTES), str(self.cluster_layout.node_log(r))]).stdout
                     for r in range(self.spec.nodes)]
            info["error"] = next((e for e in map(last_exception, tails) if e), None) or \
                f"Slurm: {slurm_state} (exit {row['exit_code']})"
        return info

    # -- stop -----------------------------------------------------------------------------------------------
    def stop(self, grace: float = 300.0, poll: float = 2.0) -> dict[str, Any]:
        """SIGTERM to the job's step (its ranks save a checkpoint), then scancel after `grace` seconds if it is
        still running (or was requeued meanwhile). A pending job is cancelled at once."""
        self.layout.state.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.layout.stop_request, json.dumps({"reason": "requested", "at": time.time()}))
        state = self.status()["state"]
        if state == "running":
            self._on_cluster(["scancel", "--signal=TERM", self.job_id])
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and (state := self.status()["state"]) == "running":
                time.sleep(poll)
        cancelled = state in ACTIVE
        if cancelled:
            res = self._on_cluster(["scancel", self.job_id])
            if res.exited != 0:
                raise SlurmError(f"scancel {self.job_id}: {(res.stderr or res.stdout).strip()[:300]}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.status()["state"] in ACTIVE:
                time.sleep(poll)
        return {"run": self.name, "sigkill_after_grace": cancelled and state == "running", "grace_s": grace,
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
