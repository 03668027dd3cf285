"""The local back-end of launch/run.py: a detached run on this node, with state under
<run_root>/<run_name>/run_state/ (the supervisor's identity, the exact command, exit.json) — what start_training.sh
and stop_training.sh did. Stop sends SIGTERM to the supervisor, which hands it to the training ranks (Megatron's
exit-signal handler saves a checkpoint), waits up to the grace period, and only then SIGKILLs. run_in_foreground
is `kaiyuan train`: the same state, with this process as the supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.launch.failure import last_exception, log_tail
from kaiyuan_recipes.launch.identity import IdentityError, ProcessIdentity, signal_if_alive
from kaiyuan_recipes.launch.run import Run, RunError
from kaiyuan_recipes.launch.stacks import report, signal_and_read
from kaiyuan_recipes.launch.supervise import (
    SUPERVISED_ENV,
    kill_run,
    live_supervisor,
    read_proc,
    record_exit,
    run_foreground,
)
from kaiyuan_recipes.run_layout import read_metrics

# Environment variables recorded with a run (never tokens or keys).
RECORDED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "HF_ENDPOINT",
                "KAIYUAN_CACHE", "PYTHONPATH")


class RunStateError(RunError):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = read_proc(pid)
    return proc is None or proc.state != "Z"  # a zombie is not running


class LocalRun(Run):
    def running_supervisor(self) -> ProcessIdentity | None:
        """The run's supervisor while it runs: the recorded identity, matched against the live process."""
        if self.layout.exit_record.is_file():
            return None
        try:
            return live_supervisor(self.layout.state)
        except IdentityError as err:
            raise RunStateError(str(err)) from None

    def running_pid(self) -> int | None:
        identity = self.running_supervisor()
        return identity.pid if identity else None

    def _check_inside_run_dir(self) -> None:
        """Run state is written only inside the run directory: a state or log folder that is a symlink leading out
        of it (planted by whoever can write the run root) is refused."""
        root = self.run_dir.resolve()
        for folder in (self.layout.state, self.layout.console_log.parent):
            if folder.is_symlink() or (folder.exists() and not folder.resolve().is_relative_to(root)):
                raise RunStateError(f"{folder}: a symlink or outside {root}; refusing to write run state there")

    def _legacy_supervisor(self) -> int | None:
        """A supervisor started by a version that recorded only supervisor.pid, if that process still runs this run."""
        legacy = self.layout.legacy_supervisor_pid
        if self.layout.supervisor_identity.exists() or not legacy.is_file() or not legacy.read_text().strip().isdigit():
            return None
        pid = int(legacy.read_text().strip())
        proc = read_proc(pid) if pid > 0 else None
        state = str(self.layout.state)
        return pid if proc and "kaiyuan_recipes.launch.supervise" in proc.argv and state in proc.argv else None

    def prepare_state(self, argv: list[str], extra: dict[str, Any] | None) -> None:
        """Refuse a run that still runs; clear the previous run's records; record the command."""
        self._check_inside_run_dir()
        if (pid := self._legacy_supervisor()) is not None:
            raise RunStateError(f"run {self.name!r} may still run under a supervisor started by an older version "
                                f"(pid {pid}, recorded without its identity): stop it with `kill -TERM {pid}`, then "
                                "start")
        if (pid := self.running_pid()) is not None:
            raise RunStateError(f"run {self.name!r} is already running (pid {pid}); stop it first")
        self._leave_multinode()
        layout = self.layout
        layout.state.mkdir(parents=True, exist_ok=True)
        layout.console_log.parent.mkdir(parents=True, exist_ok=True)
        for stale in (layout.exit_record, layout.stop_request, layout.child_pid, layout.supervisor_identity):
            stale.unlink(missing_ok=True)
        env = redacted_env({k: os.environ[k] for k in RECORDED_ENV if k in os.environ})
        write_text_atomic(layout.command, json.dumps(
            {"argv": argv, "started_at": time.time(), "env": env, **(extra or {})}, indent=2), mode=0o600)

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
        if state == "running":
            raise RunStateError(f"run {self.name!r} is running on several nodes; `kaiyuan stop {self.name}` first")
        self.layout.multinode_state.unlink()

    def start(self, argv: list[str], extra: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[int, int]:
        """Start `argv` detached, supervised, in its own process group. Refuses a run already running."""
        self.prepare_state(argv, extra)
        log_path, identity = self.layout.console_log, self.layout.supervisor_identity
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kaiyuan_recipes.launch.supervise", str(self.layout.state), "--", *argv],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout  # the supervisor records its identity first thing
        while not identity.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not identity.is_file():
            raise RunStateError(f"run {self.name!r}: the supervisor did not start (see {log_path})")
        return {0: proc.pid}

    def stop(self, grace: float = 300.0, poll: float = 0.5) -> dict[str, Any]:
        supervisor = self.running_supervisor()
        if supervisor is None or not signal_if_alive(supervisor, signal.SIGTERM):  # it hands it to the ranks
            raise RunStateError(f"run {self.name!r} is not running")
        exit_record = self.layout.exit_record
        last_ckpt = self._last_checkpoint()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not exit_record.is_file() and supervisor.is_alive():
            time.sleep(poll)
        killed = False
        if not exit_record.is_file():
            # torchrun starts each rank in its own session: our group alone would miss them
            killed = kill_run(supervisor)
        new_ckpt = self._last_checkpoint()
        result = {"run": self.name, "sigkill_after_grace": killed, "grace_s": grace,
                  "checkpoint_saved": new_ckpt is not None and new_ckpt != last_ckpt, "last_checkpoint": new_ckpt}
        write_text_atomic(self.layout.stop_request, json.dumps(result))
        return result

    def stop_problems(self, result: dict[str, Any]) -> list[str]:
        if result["sigkill_after_grace"]:
            return [f"did not exit within {result['grace_s']:g}s of SIGTERM; sent SIGKILL"]
        return []

    def _last_checkpoint(self) -> int | None:
        events = [r["iteration"] for r in read_metrics(self.layout.state) if r.get("event") == "checkpoint"]
        return events[-1] if events else None

    def status(self) -> dict[str, Any]:
        layout = self.layout
        if not layout.state.is_dir():
            raise RunStateError(f"{self.run_dir}: no run state (was it started with `kaiyuan start`?)")
        command = json.loads(layout.command.read_text()) if layout.command.is_file() else {}
        exit_info = json.loads(layout.exit_record.read_text()) if layout.exit_record.is_file() else None
        if self.running_pid() is not None:
            state = "running"
        elif exit_info is None:
            state = "unknown (no exit record; supervisor killed?)"
        elif layout.stop_request.is_file():
            state = "stopped"
        else:
            state = "finished" if exit_info["exit_code"] == 0 else "failed"
        steps = [r for r in read_metrics(layout.state) if r.get("event") == "step"]
        out: dict[str, Any] = {"run": self.name, "state": state, "exit": exit_info}
        if state == "failed" and layout.console_log.is_file():
            out["error"] = last_exception(log_tail(layout.console_log))
        if steps:
            last = steps[-1]
            recent = steps[-10:]
            step_time = sum(r["step_time_s"] for r in recent) / len(recent)
            total = command.get("train_iters")
            out.update(iteration=last["iteration"], loss=last["loss"], lr=last["lr"],
                       tokens_per_s_per_gpu=sum(r["tokens_per_s_per_gpu"] for r in recent) / len(recent),
                       train_iters=total,
                       eta_s=(total - last["iteration"]) * step_time if total and state == "running" else None)
        if evals := [r for r in read_metrics(layout.state) if r.get("event") == "heldout_eval"]:  # kaiyuan.heldout_eval
            out["heldout_eval"] = {"iteration": evals[-1]["iteration"], **evals[-1]["overall"]}
        return out

    def logs(self, follow: bool = False, out: TextIO | None = None, poll: float = 0.5,
             stop_when_done: bool = True) -> None:
        out = sys.stdout if out is None else out
        log_path = self.layout.console_log
        if not log_path.is_file():
            raise RunStateError(f"{log_path}: no log yet")
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            while True:
                chunk = fh.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                if not follow or (stop_when_done and self.running_pid() is None):
                    if follow:
                        out.write(fh.read())
                    return
                time.sleep(poll)

    def stacks(self, timeout: float = 10.0, quiet: float = 0.5) -> str:
        pid = self.running_pid()
        if pid is None:
            raise RunStateError(f"run {self.name!r} is not running")
        return report(*signal_and_read(pid, self.layout.console_log, timeout, quiet))


def run_in_foreground(run_dir: Path, argv: list[str], log_path: Path, extra: dict[str, Any] | None = None) -> int:
    """`kaiyuan train`: run `argv` here with the same run state a detached run has (this process is the
    supervisor), so `kaiyuan status` tells finished / failed / stopped and a second start is refused. Under a
    supervisor (`kaiyuan start`), that one records the state."""
    if os.environ.get(SUPERVISED_ENV):
        return run_foreground(argv, log_path)
    run = LocalRun(run_dir)
    run.prepare_state(argv, extra)
    me = ProcessIdentity.of(os.getpid())
    assert me is not None
    me.save(run.layout.supervisor_identity)

    def stopped() -> None:
        write_text_atomic(run.layout.stop_request, json.dumps({"run": run.name, "signal": "SIGTERM",
                                                               "foreground": True, "at": time.time()}))

    code = 1
    try:
        code = run_foreground(argv, log_path, on_stop=stopped)
    finally:
        record_exit(run.layout.state, code)
    return code
