"""Detached runs on this node: start / stop / status / logs, with state under
<run_root>/<run_name>/run_state/ (pid, the exact command, exit.json) — what start_training.sh and
stop_training.sh did, as one module. Stop sends SIGTERM to the supervisor, which hands it to the training ranks (Megatron's
exit-signal handler saves a checkpoint), waits up to the grace period, and only then SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import redacted_env, write_text_atomic
from kaiyuan_recipes.launch.failure import last_exception, log_tail
from kaiyuan_recipes.launch.identity import IdentityError, ProcessIdentity, signal_if_alive
from kaiyuan_recipes.launch.supervise import (IDENTITY_FILE, SUPERVISED_ENV, kill_run, live_supervisor, read_proc,
                                              record_exit, run_foreground)
from kaiyuan_recipes.training.metrics_log import read_metrics

# Environment variables recorded with a run (never tokens or keys).
RECORDED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "HF_ENDPOINT",
                "KAIYUAN_CACHE", "PYTHONPATH")


class RunStateError(RuntimeError):
    pass


@dataclass
class RunPaths:
    run_dir: Path

    @property
    def state(self) -> Path:
        return self.run_dir / "run_state"

    @property
    def log(self) -> Path:
        return self.run_dir / "logs" / "console.log"

    @property
    def identity_file(self) -> Path:
        return self.state / IDENTITY_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = read_proc(pid)
    return proc is None or proc.state != "Z"  # a zombie is not running


def running_supervisor(paths: RunPaths) -> ProcessIdentity | None:
    """The run's supervisor while it runs: the recorded identity, matched against the live process."""
    if (paths.state / "exit.json").is_file():
        return None
    try:
        return live_supervisor(paths.state)
    except IdentityError as err:
        raise RunStateError(str(err)) from None


def running_pid(paths: RunPaths) -> int | None:
    identity = running_supervisor(paths)
    return identity.pid if identity else None


def _inside_run_dir(paths: RunPaths) -> None:
    """Run state is written only inside the run directory: a state or log folder that is a symlink leading out
    of it (planted by whoever can write the run root) is refused."""
    root = paths.run_dir.resolve()
    for folder in (paths.state, paths.log.parent):
        if folder.is_symlink() or (folder.exists() and not folder.resolve().is_relative_to(root)):
            raise RunStateError(f"{folder}: a symlink or outside {root}; refusing to write run state there")


def _legacy_supervisor(paths: RunPaths) -> int | None:
    """A supervisor started by a version that recorded only supervisor.pid, if that process still runs this run."""
    legacy = paths.state / "supervisor.pid"
    if paths.identity_file.exists() or not legacy.is_file() or not legacy.read_text().strip().isdigit():
        return None
    pid = int(legacy.read_text().strip())
    proc = read_proc(pid) if pid > 0 else None
    return pid if proc and "kaiyuan_recipes.launch.supervise" in proc.argv and str(paths.state) in proc.argv else None


def _prepare_state(paths: RunPaths, argv: list[str], extra: dict[str, Any] | None) -> None:
    _inside_run_dir(paths)
    if (pid := _legacy_supervisor(paths)) is not None:
        raise RunStateError(f"run {paths.run_dir.name!r} may still run under a supervisor started by an older version "
                            f"(pid {pid}, recorded without its identity): stop it with `kill -TERM {pid}`, then start")
    if (pid := running_pid(paths)) is not None:
        raise RunStateError(f"run {paths.run_dir.name!r} is already running (pid {pid}); stop it first")
    paths.state.mkdir(parents=True, exist_ok=True)
    paths.log.parent.mkdir(parents=True, exist_ok=True)
    for stale in ("exit.json", "stop.json", "child.pid", IDENTITY_FILE):
        (paths.state / stale).unlink(missing_ok=True)
    env = redacted_env({k: os.environ[k] for k in RECORDED_ENV if k in os.environ})
    write_text_atomic(paths.state / "command.json", json.dumps(
        {"argv": argv, "started_at": time.time(), "env": env, **(extra or {})}, indent=2), mode=0o600)


def start(run_dir: Path, argv: list[str], extra: dict[str, Any] | None = None, timeout: float = 30.0) -> int:
    """Start `argv` detached, supervised, in its own process group. Refuses a run already running."""
    paths = RunPaths(Path(run_dir))
    _prepare_state(paths, argv, extra)
    with open(paths.log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kaiyuan_recipes.launch.supervise", str(paths.state), "--", *argv],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    deadline = time.monotonic() + timeout  # the supervisor records its identity first thing
    while not paths.identity_file.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not paths.identity_file.is_file():
        raise RunStateError(f"run {paths.run_dir.name!r}: the supervisor did not start (see {paths.log})")
    return proc.pid


def run_in_foreground(run_dir: Path, argv: list[str], log_path: Path, extra: dict[str, Any] | None = None) -> int:
    """`kaiyuan train`: run `argv` here with the same run state a detached run has (this process is the
    supervisor), so `kaiyuan status` tells finished / failed / stopped and a second start is refused. Under a
    supervisor (`kaiyuan start`), that one records the state."""
    if os.environ.get(SUPERVISED_ENV):
        return run_foreground(argv, log_path)
    paths = RunPaths(Path(run_dir))
    _prepare_state(paths, argv, extra)
    me = ProcessIdentity.of(os.getpid())
    assert me is not None
    me.save(paths.identity_file)

    def stopped() -> None:
        write_text_atomic(paths.state / "stop.json", json.dumps({"run": paths.run_dir.name, "signal": "SIGTERM",
                                                                 "foreground": True, "at": time.time()}))

    code = 1
    try:
        code = run_foreground(argv, log_path, on_stop=stopped)
    finally:
        record_exit(paths.state, code)
    return code


def stop(run_dir: Path, grace: float = 300.0, poll: float = 0.5) -> dict[str, Any]:
    paths = RunPaths(Path(run_dir))
    supervisor = running_supervisor(paths)
    if supervisor is None or not signal_if_alive(supervisor, signal.SIGTERM):  # it hands it to the ranks
        raise RunStateError(f"run {paths.run_dir.name!r} is not running")
    last_ckpt = _last_checkpoint(paths)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not (paths.state / "exit.json").is_file() and supervisor.is_alive():
        time.sleep(poll)
    killed = False
    if not (paths.state / "exit.json").is_file():
        # torchrun starts each rank in its own session: our group alone would miss them
        killed = kill_run(supervisor)
    new_ckpt = _last_checkpoint(paths)
    result = {"run": paths.run_dir.name, "sigkill_after_grace": killed, "grace_s": grace,
              "checkpoint_saved": new_ckpt is not None and new_ckpt != last_ckpt, "last_checkpoint": new_ckpt}
    write_text_atomic(paths.state / "stop.json", json.dumps(result))
    return result


def _last_checkpoint(paths: RunPaths) -> int | None:
    events = [r["iteration"] for r in read_metrics(paths.state) if r.get("event") == "checkpoint"]
    return events[-1] if events else None


def status(run_dir: Path) -> dict[str, Any]:
    paths = RunPaths(Path(run_dir))
    if not paths.state.is_dir():
        raise RunStateError(f"{paths.run_dir}: no run state (was it started with `kaiyuan start`?)")
    command = json.loads((paths.state / "command.json").read_text()) if (paths.state / "command.json").is_file() else {}
    exit_info = json.loads((paths.state / "exit.json").read_text()) if (paths.state / "exit.json").is_file() else None
    if running_pid(paths) is not None:
        state = "running"
    elif exit_info is None:
        state = "unknown (no exit record; supervisor killed?)"
    elif (paths.state / "stop.json").is_file():
        state = "stopped"
    else:
        state = "finished" if exit_info["exit_code"] == 0 else "failed"
    steps = [r for r in read_metrics(paths.state) if r.get("event") == "step"]
    out: dict[str, Any] = {"run": paths.run_dir.name, "state": state, "exit": exit_info}
    if state == "failed" and paths.log.is_file():
        out["error"] = last_exception(log_tail(paths.log))
    if steps:
        last = steps[-1]
        recent = steps[-10:]
        step_time = sum(r["step_time_s"] for r in recent) / len(recent)
        total = command.get("train_iters")
        out.update(iteration=last["iteration"], loss=last["loss"], lr=last["lr"],
                   tokens_per_s_per_gpu=sum(r["tokens_per_s_per_gpu"] for r in recent) / len(recent),
                   train_iters=total,
                   eta_s=(total - last["iteration"]) * step_time if total and state == "running" else None)
    return out


def follow_log(run_dir: Path, follow: bool, out=sys.stdout, poll: float = 0.5, stop_when_done: bool = True) -> None:
    paths = RunPaths(Path(run_dir))
    if not paths.log.is_file():
        raise RunStateError(f"{paths.log}: no log yet")
    with open(paths.log, encoding="utf-8", errors="replace") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                out.write(chunk)
                out.flush()
            if not follow or (stop_when_done and running_pid(paths) is None):
                if follow:
                    out.write(fh.read())
                return
            time.sleep(poll)
