"""The local back-end of launch/run.py: a detached run on this node, with state under
<run_root>/<run_name>/run_state/ (the supervisor's identity, the exact command, exit.json, the run's lock and
token) — what start_training.sh and stop_training.sh did. A start claims the run directory (launch/membership.py):
refused while anything of its previous run is alive. Stop sends SIGTERM to the supervisor, which hands it to the
training ranks (Megatron's exit-signal handler saves a checkpoint; a rank still setting up just ends), waits up to
the grace period, and only then SIGKILLs; with the supervisor gone it stops the ranks itself. run_in_foreground is
`kaiyuan train`: the same state, with this process as the supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.config.run_layout import read_metrics
from kaiyuan_recipes.launch import membership
from kaiyuan_recipes.launch.failure import last_exception, log_tail
from kaiyuan_recipes.launch.identity import IdentityError, ProcessIdentity
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.run_records import (
    RunStateError,
    check_own_folders,
    finite,
    last_checkpoint,
    read_command,
    read_exit,
    read_phase,
    read_stop,
)
from kaiyuan_recipes.launch.stacks import report, signal_and_read
from kaiyuan_recipes.launch.supervise import (
    SUPERVISED_ENV,
    Alive,
    kill_all,
    record_exit,
    run_alive,
    run_foreground,
    running_pid,
    terminate,
)
from kaiyuan_recipes.processes import read_proc
from kaiyuan_recipes.run_states import ALIVE, Phase, RunState

# Environment variables recorded with a run (never tokens or keys).
RECORDED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "HF_ENDPOINT",
                "KAIYUAN_CACHE", "PYTHONPATH")

__all__ = ["LocalRun", "RunStateError", "run_in_foreground"]


class LocalRun(Run):
    def alive(self) -> Alive:
        """What of this run is alive now: its supervisor, every process of it (launch/membership.py)."""
        check_own_folders(self.layout)
        try:
            return run_alive(self.layout.state)
        except IdentityError as err:
            raise RunStateError(str(err)) from None

    def running_pid(self) -> int | None:
        """While anything of the run is alive: its supervisor, or with the supervisor gone a process of the run
        that is still alive; None when nothing is."""
        return running_pid(self.layout.state)

    def _legacy_supervisor(self) -> int | None:
        """A supervisor started by a version that recorded only supervisor.pid, if that process still runs this run."""
        legacy = self.layout.legacy_supervisor_pid
        if self.layout.supervisor_identity.exists() or not legacy.is_file() or not legacy.read_text().strip().isdigit():
            return None
        pid = int(legacy.read_text().strip())
        proc = read_proc(pid) if pid > 0 else None
        state = str(self.layout.state)
        return pid if proc and "kaiyuan_recipes.launch.supervise" in proc.argv and state in proc.argv else None

    def prepare_state(self, argv: list[str], extra: dict[str, Any] | None) -> membership.Claim:
        """Claim the run directory (refused while anything of its previous run is alive); clear the previous run's
        records; record the command. The returned claim holds the run's lock: keep it open for the run's life."""
        check_own_folders(self.layout)
        if (pid := self._legacy_supervisor()) is not None:
            raise RunStateError(f"run {self.name!r} may still run under a supervisor started by an older version "
                                f"(pid {pid}, recorded without its identity): stop it with `kill -TERM {pid}`, then "
                                "start")
        layout = self.layout
        layout.state.mkdir(parents=True, exist_ok=True)
        claim = membership.claim(layout.state, f"run {self.name!r} is already running")
        try:
            self._leave_multinode()
            self._refuse_while_on_slurm()
            layout.console_log.parent.mkdir(parents=True, exist_ok=True)
            for stale in (layout.exit_record, layout.stop_request, layout.child_pid, layout.supervisor_identity,
                          layout.phase):
                stale.unlink(missing_ok=True)
            env = redacted_env({k: os.environ[k] for k in RECORDED_ENV if k in os.environ})
            write_text_atomic(layout.command, json.dumps(
                {"argv": argv, "started_at": time.time(), "env": env, **(extra or {})}, indent=2), mode=0o600)
        except BaseException:
            os.close(claim.fd)
            raise
        return claim

    def _refuse_while_on_slurm(self) -> None:
        """Two trainings in one run directory: a run whose Slurm job is pending or running is not started here."""
        if not self.layout.slurm_state.is_file():
            return
        from kaiyuan_recipes.launch.slurm import ACTIVE, SlurmRun

        try:
            status = SlurmRun(self.run_dir).status()
        except RunError as err:
            raise RunStateError(f"run {self.name!r} was submitted to Slurm and the scheduler cannot be asked whether "
                                f"its job still runs ({err}); `kaiyuan stop {self.name}` there, or remove "
                                f"{self.layout.slurm_state}") from None
        if status["state"] in ACTIVE:
            raise RunStateError(f"run {self.name!r} is {status['state']} on Slurm (job {status.get('job_id')}); "
                                f"`kaiyuan stop {self.name}` first")

    def _leave_multinode(self) -> None:
        """A directory a multi-node run used becomes this node's: its multinode.json would keep routing stop /
        status / logs to the old nodes (launch/backends.py). Refused while that run still runs."""
        if not self.layout.multinode_state.is_file():
            return
        from kaiyuan_recipes.launch.ssh import MultiNodeRun

        try:
            state = MultiNodeRun(self.run_dir).status()["state"]
        except RunError as err:
            raise RunStateError(f"run {self.name!r} was multi-node and its nodes cannot be asked whether it still "
                                f"runs ({err}); stop it there, or remove {self.layout.multinode_state}") from None
        if state in ALIVE:
            raise RunStateError(f"run {self.name!r} is running on several nodes; `kaiyuan stop {self.name}` first")
        self.layout.multinode_state.unlink()

    def start(self, argv: list[str], extra: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[int, int]:
        """Start `argv` detached, supervised, in its own process group. Refused while the run is alive."""
        claim = self.prepare_state(argv, extra)
        log_path, identity = self.layout.console_log, self.layout.supervisor_identity
        # The supervisor inherits the claim's lock (and keeps it while it lives) and the run's token.
        env = dict(os.environ, **claim.env(), **{membership.LOCK_FD_ENV: str(claim.fd)})
        try:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "kaiyuan_recipes.launch.supervise", str(self.layout.state), "--", *argv],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                    env=env, pass_fds=(claim.fd,),
                )
        finally:
            os.close(claim.fd)
        deadline = time.monotonic() + timeout  # the supervisor records its identity first thing
        while not identity.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not identity.is_file():
            raise RunStateError(f"run {self.name!r}: the supervisor did not start (see {log_path})")
        return {0: proc.pid}

    def stop(self, grace: float = 300.0, poll: float = 0.5) -> dict[str, Any]:
        """SIGTERM what of the run is alive (the supervisor, which hands it on; the ranks when it is gone), wait up to
        `grace`, then SIGKILL what is left. A run with nothing alive is refused with what it is, and so is a stop
        while another is under way (its grace is never shortened); nothing is signalled then."""
        check_own_folders(self.layout)
        if not self.layout.state.is_dir():
            raise RunStateError(self._not_running())
        with membership.sole_stop(self.layout, self.name):
            return self._stop(grace, poll)

    def _stop(self, grace: float, poll: float) -> dict[str, Any]:
        alive = self.alive()
        if not alive.processes:
            raise RunStateError(self._not_running())
        last_ckpt = self._last_checkpoint()
        # On record before the signal: status says stopped (not failed) as soon as the run ends.
        write_text_atomic(self.layout.stop_request, json.dumps({"run": self.name, "signal": "SIGTERM",
                                                                "requested_at": time.time(), "grace_s": grace,
                                                                "by_pid": os.getpid()}))
        signalled = terminate(alive)
        # From here on nothing may keep the grace period and the SIGKILL from happening.
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                if not run_alive(self.layout.state).processes:
                    break
            except Exception as err:  # noqa: BLE001
                print(f"kaiyuan: {self.name}: {err}", file=sys.stderr)
            time.sleep(poll)
        killed = kill_all(self.layout.state)
        new_ckpt = self._last_checkpoint()
        result = {"run": self.name, "sigkill_after_grace": killed, "grace_s": grace,
                  "checkpoint_saved": new_ckpt is not None and new_ckpt != last_ckpt, "last_checkpoint": new_ckpt}
        if not alive.supervisor:
            result["supervisor_lost"] = True
            result["signalled"] = signalled
        try:
            write_text_atomic(self.layout.stop_request, json.dumps(result))
        except OSError as err:
            print(f"kaiyuan: {self.name}: could not record the stop in {self.layout.stop_request}: {err}",
                  file=sys.stderr)
        return result

    def _not_running(self) -> str:
        try:
            status = self.status()
        except RunStateError as err:
            return f"run {self.name!r} is not running ({err}); nothing signalled"
        if status["state"] == RunState.LOST:
            return (f"run {self.name!r} is lost: nothing of it runs, and it neither finished nor was stopped "
                    f"(last iteration {status.get('iteration')}, last checkpoint {status.get('last_checkpoint')}); "
                    "nothing signalled")
        return f"run {self.name!r} is not running ({status['phase']}); nothing signalled"

    def stop_problems(self, result: dict[str, Any]) -> list[str]:
        problems = []
        if result.get("supervisor_lost"):
            problems.append(f"its supervisor was gone; SIGTERM went to the ranks directly ({result['signalled']})")
        if result["sigkill_after_grace"]:
            problems.append(f"did not exit within {result['grace_s']:g}s of SIGTERM; sent SIGKILL")
        return problems

    def _last_checkpoint(self) -> int | None:
        try:
            return last_checkpoint(self.layout, read_metrics(self.layout.state))
        except OSError:
            return None

    def status(self) -> dict[str, Any]:
        """state: running / running — supervisor lost / lost / stopped / finished / failed; phase: what it does or
        how it ended (setting up: ..., training, saving, stopped before its first step, failed: <error>, ...)."""
        layout = self.layout
        check_own_folders(layout)
        if not layout.state.is_dir():
            raise RunStateError(f"{self.run_dir}: no run state (was it started with `kaiyuan start`?)")
        command = read_command(layout)
        exit_info = read_exit(layout.exit_record)
        alive = self.alive()
        stop = read_stop(layout)
        phase = read_phase(layout)
        metrics = read_metrics(layout.state)
        out: dict[str, Any] = {"run": self.name}
        # The supervisor records the exit after its child has ended, then exits itself: in between, only the
        # supervisor is alive and the recorded exit is the truth.
        ending = exit_info is not None and set(alive.processes) <= {alive.supervisor}
        if alive.state is not None and not ending:
            state, shown = alive.state, phase or f"{Phase.SETTING_UP}: starting"
        elif stop is not None:  # by `kaiyuan stop` (also one that found the supervisor gone) or a SIGTERM to it
            state = RunState.STOPPED
            shown = Phase.STOPPED_BEFORE_FIRST_STEP if phase is None or Phase.is_setting_up(phase) else state
        elif exit_info is None:
            state = shown = RunState.LOST
        elif exit_info["exit_code"] == 0:
            state = shown = RunState.FINISHED
        else:
            state = RunState.FAILED
            out["error"] = self._error(command)
            shown = f"{state}: {out['error']}" if out["error"] else state
        out.update(state=state, phase=shown, exit=exit_info)
        if state == RunState.SUPERVISOR_LOST:
            out["alive"] = list(alive.processes)
        steps = [r for r in metrics if r.get("event") == "step" and type(r.get("iteration")) is int]
        if steps:
            last, recent = steps[-1], steps[-10:]
            times = [r["step_time_s"] for r in recent if finite(r.get("step_time_s"))]
            rates = [r["tokens_per_s_per_gpu"] for r in recent if finite(r.get("tokens_per_s_per_gpu"))]
            total = command.get("train_iters") or planned_train_iters(self.run_dir)
            out.update(iteration=last["iteration"], loss=last.get("loss"), lr=last.get("lr"),
                       tokens_per_s_per_gpu=sum(rates) / len(rates) if rates else None, train_iters=total,
                       eta_s=(total - last["iteration"]) * sum(times) / len(times)
                       if total and times and state == RunState.RUNNING else None)
        out["last_checkpoint"] = last_checkpoint(layout, metrics)
        evals = [r for r in metrics if r.get("event") == "heldout_eval" and type(r.get("iteration")) is int
                 and isinstance(r.get("overall"), dict)]
        if evals:  # kaiyuan.heldout_eval
            out["heldout_eval"] = {"iteration": evals[-1]["iteration"], **evals[-1]["overall"]}
        return out

    def _error(self, command: dict[str, Any]) -> str | None:
        """The last exception in the run's log: the console log of a detached run, the log a foreground
        `kaiyuan train` wrote (recorded with its command; only a file in the run's logs/ is read)."""
        log = self.layout.console_log
        recorded = command.get("log")
        if isinstance(recorded, str) and Path(recorded).resolve().parent == self.layout.logs.resolve():
            log = Path(recorded)
        try:
            return last_exception(log_tail(log)) if log.is_file() else None
        except OSError:
            return None

    def logs(self, follow: bool = False, out: TextIO | None = None, poll: float = 0.5,
             stop_when_done: bool = True) -> None:
        out = sys.stdout if out is None else out
        log_path = self.layout.console_log
        if not self.run_dir.is_dir():
            raise RunStateError(f"{self.run_dir}: no such run")
        if not log_path.is_file():
            raise RunStateError(f"{log_path}: no log yet")
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            while True:
                chunk = fh.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                if not follow or (stop_when_done and not self.alive().processes):
                    if follow:
                        out.write(fh.read())
                    return
                time.sleep(poll)

    def stacks(self, timeout: float = 10.0, quiet: float = 0.5) -> str:
        alive = self.alive()
        if not alive.processes:
            raise RunStateError(f"run {self.name!r} is not running")
        root = alive.supervisor or alive.processes[0]  # the oldest PID left: the top of what remains
        return report(*signal_and_read(root, self.layout.console_log, timeout, quiet))


def run_in_foreground(run_dir: Path, argv: list[str], log_path: Path, extra: dict[str, Any] | None = None,
                      announce: str = "") -> int:
    """`kaiyuan train`: run `argv` here with the same run state a detached run has (this process is the
    supervisor: it holds the run's lock, its children carry the run's token), so `kaiyuan status` tells finished /
    failed / stopped and a second start is refused. Under a supervisor (`kaiyuan start`), that one records it.
    `announce` is printed once the run is this process's: a refused start says only why."""
    if os.environ.get(SUPERVISED_ENV):
        if announce:
            print(announce, flush=True)
        return run_foreground(argv, log_path, state_dir=Path(os.environ[SUPERVISED_ENV]))
    run = LocalRun(run_dir)
    claim = run.prepare_state(argv, {**(extra or {}), "log": str(log_path)})
    if announce:
        print(announce, flush=True)
    os.environ.update(claim.env())  # for torchrun and the ranks below it
    me = ProcessIdentity.of(os.getpid())
    assert me is not None
    me.save(run.layout.supervisor_identity)

    def stopped() -> None:
        write_text_atomic(run.layout.stop_request, json.dumps({"run": run.name, "signal": "SIGTERM",
                                                               "foreground": True, "at": time.time()}))

    code = 1
    try:
        code = run_foreground(argv, log_path, on_stop=stopped, state_dir=run.layout.state)
    finally:
        record_exit(run.layout.state, code)
    return code


def planned_train_iters(run_dir: Path) -> int | None:
    """The run length rank 0 resolved (a curriculum phase decides it there, not where the run was started)."""
    from kaiyuan_recipes.config.plan_file import PlanFileError, read_plan

    try:
        plan = read_plan(run_dir)
    except (PlanFileError, OSError):
        return None
    value = (((plan or {}).get("container") or {}).get("train") or {}).get("train_iters")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
