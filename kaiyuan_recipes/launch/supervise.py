"""The detached supervisor of a run: `python -m kaiyuan_recipes.launch.supervise STATE_DIR -- ARGV…`.
It leads the run's process group, runs ARGV, and records the exit code (and signal) in STATE_DIR/exit.json when
it ends (the file names: run_layout.py), so `kaiyuan status` can tell finished from failed from stopped.

A stop is SIGTERM to the supervisor, which hands it to the training ranks only — the children of each
torchrun agent below it. Not to the whole group: torchrun answers SIGTERM by killing its ranks 30 s later
(whether or not their checkpoint is written), and the ranks' DataLoader workers die on it, which fails the
rank on its next batch. Megatron's exit-signal handler in each rank saves and exits; torchrun and the
launcher then end on their own. `kaiyuan train` in the foreground does the same with a SIGTERM it gets
(run_foreground)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.launch.identity import ProcessIdentity, signal_if_alive
from kaiyuan_recipes.run_layout import CHILD_PID_FILE, EXIT_FILE, IDENTITY_FILE

SUPERVISED_ENV = "KAIYUAN_SUPERVISED"  # set for the command a supervisor runs: it records nothing itself

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


class Proc(NamedTuple):
    ppid: int
    state: str  # "Z": a zombie, not running
    argv: list[str]


def read_proc(pid: int) -> Proc | None:
    """Parent, state and argv of `pid` from /proc; None once it is gone (or unreadable)."""
    entry = Path(f"/proc/{pid}")
    try:
        stat = (entry / "stat").read_bytes().decode(errors="replace")  # comm may be any bytes
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]  # after "pid (comm)"
        return Proc(int(ppid), state, [a.decode(errors="replace") for a in argv if a])
    except (OSError, ValueError, IndexError):  # exited meanwhile (empty or vanished files)
        return None


def processes() -> dict[int, Proc]:
    """Every process this user can see."""
    table = {int(e.name): read_proc(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    return {pid: proc for pid, proc in table.items() if proc is not None}


def is_torchrun(argv: list[str]) -> bool:
    """`python -m torch.distributed.run …` or the `torchrun` script (not a command that merely names it)."""
    if not argv:
        return False
    if Path(argv[0]).name == "torchrun" or (len(argv) > 1 and Path(argv[1]).name == "torchrun"):
        return True
    return len(argv) > 2 and argv[1] == "-m" and argv[2] in TORCHRUN_MODULES


def training_ranks(root: int) -> list[int]:
    """The processes torchrun agents below `root` started (the ranks); an agent itself while it has started
    none yet (it then shuts down cleanly on SIGTERM); `[root]` when there is no agent."""
    table = processes()
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    ranks, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table and is_torchrun(table[pid].argv):
            ranks += children.get(pid, []) or [pid]
        else:
            todo += children.get(pid, [])
    return ranks or [root]


def forward_stop(child_pid: int) -> list[int]:
    try:
        ranks = training_ranks(child_pid)
    except Exception as err:  # noqa: BLE001  (a signal handler must not kill the supervisor)
        print(f"kaiyuan supervisor: could not list the ranks ({err!r}); stopping {child_pid}", file=sys.stderr)
        ranks = [child_pid]
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    print(f"kaiyuan supervisor: SIGTERM to rank process(es) {ranks}", file=sys.stderr, flush=True)
    return ranks


def run_foreground(argv: list[str], log_path: Path, on_stop: Callable[[], None] | None = None) -> int:
    """Run `argv` (torchrun) in the foreground, its output to stdout and `log_path`; a SIGTERM to this
    process (a scheduler's, `timeout`'s) is handed to the ranks as `kaiyuan stop` would, so they save a
    checkpoint and exit instead of being killed by torchrun (`on_stop` is called first)."""

    proc: subprocess.Popen | None = None
    pending: list[bool] = []

    def stop(*_: Any) -> None:
        if on_stop is not None:
            on_stop()
        if proc is None:
            pending.append(True)
        else:
            forward_stop(proc.pid)

    previous = signal.signal(signal.SIGTERM, stop)  # before the child exists: an early SIGTERM still stops it
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        if pending:
            forward_stop(proc.pid)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
            return proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)


def kill_run(supervisor: ProcessIdentity) -> bool:
    """SIGKILL a run: the supervisor's process group, and each rank's own session (torchrun's). Only while the
    recorded supervisor is still that process (launch/identity.py); False when it is not."""
    if not supervisor.is_alive():
        return False
    ranks = training_ranks(supervisor.pid)
    for group in (supervisor.pid, *[r for r in ranks if r != supervisor.pid]):
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return True


def is_supervisor_argv(argv: tuple[str, ...] | list[str], state_dir: Path) -> bool:
    """A supervisor's command line for this run: this module with this state directory, or a foreground
    `kaiyuan train` (the CLI as a module or its console script, which supervises itself). A recorded identity
    naming anything else is never signalled, even when it matches a live process."""
    argv = list(argv)
    if "kaiyuan_recipes.launch.supervise" in argv:
        return str(state_dir) in argv or str(Path(state_dir).resolve()) in argv
    cli = "kaiyuan_recipes.cli.main" in argv[:4] or any(Path(a).name == "kaiyuan" for a in argv[:3])
    return cli and "train" in argv


def live_supervisor(state_dir: Path) -> ProcessIdentity | None:
    """The supervisor recorded in `state_dir` while that very process runs (an IdentityError for a record that
    kaiyuan would not have written)."""
    identity = ProcessIdentity.load(Path(state_dir) / IDENTITY_FILE)
    if identity is None or not is_supervisor_argv(identity.argv, state_dir) or not identity.is_alive():
        return None
    return identity


def record_exit(state_dir: Path, code: int) -> None:
    record = {"exit_code": code, "signal": -code if code < 0 else None, "ended_at": time.time()}
    write_text_atomic(Path(state_dir) / EXIT_FILE, json.dumps(record))


def node_verb(verb: str, state_dir: Path) -> int:
    """What `kaiyuan stop` / `status` run on a node, against the identity the node's supervisor recorded:
    --term (SIGTERM), --kill (the run's groups), --status (the exit record, or RUNNING or LOST)."""
    try:
        identity = live_supervisor(state_dir)
    except ValueError as err:
        print(f"kaiyuan supervisor: {err}", file=sys.stderr)
        identity = None
    if verb == "--status":  # the exit record, else RUNNING / LOST; the record is read again after the
        exit_file = Path(state_dir) / EXIT_FILE  # liveness check: the supervisor may have just written it
        for attempt in (0, 1):
            if exit_file.is_file():
                print(exit_file.read_text())
                return 0
            if attempt == 0 and identity is not None:
                print("RUNNING")
                return 0
        print("LOST")
        return 0
    if identity is None:
        print(f"kaiyuan supervisor: {state_dir}: no live supervisor on record; nothing signalled", file=sys.stderr)
        return 3
    sent = signal_if_alive(identity, signal.SIGTERM) if verb == "--term" else kill_run(identity)
    return 0 if sent else 3


USAGE = ("usage: python -m kaiyuan_recipes.launch.supervise [--new-session] STATE_DIR -- ARGV...\n"
         "       python -m kaiyuan_recipes.launch.supervise --term|--kill|--status STATE_DIR")


def main(argv: list[str]) -> int:
    if argv[:1] in (["--term"], ["--kill"], ["--status"]):
        if len(argv) != 2:
            raise SystemExit(USAGE)
        return node_verb(argv[0], Path(argv[1]))
    new_session = bool(argv) and argv[0] == "--new-session"  # remote nodes: lead our own process group
    argv = argv[1:] if new_session else argv
    if "--" not in argv or argv.index("--") != 1:
        raise SystemExit(USAGE)
    if new_session:
        os.setsid()
    state_dir, command = Path(argv[0]), argv[2:]
    state_dir.mkdir(parents=True, exist_ok=True)
    # The handler goes in before the identity is on record: a stop that comes at once (kaiyuan start returns when
    # the record exists) must reach the ranks, not kill the supervisor and orphan them.
    child: subprocess.Popen | None = None
    stop_pending: list[bool] = []

    def on_term(*_: Any) -> None:
        if child is None:
            stop_pending.append(True)
        else:
            forward_stop(child.pid)

    signal.signal(signal.SIGTERM, on_term)  # a Python handler (not SIG_IGN) is reset to the default at exec
    me = ProcessIdentity.of(os.getpid())
    assert me is not None
    me.save(state_dir / IDENTITY_FILE)
    child = subprocess.Popen(command, env=dict(os.environ, **{SUPERVISED_ENV: str(state_dir)}))
    if stop_pending:
        forward_stop(child.pid)
    write_text_atomic(state_dir / CHILD_PID_FILE, str(child.pid))
    code = child.wait()
    record_exit(state_dir, code)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
