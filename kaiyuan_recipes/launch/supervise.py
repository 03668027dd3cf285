"""The detached supervisor of a run: `python -m kaiyuan_recipes.launch.supervise STATE_DIR -- ARGV…`.
It leads the run's process group, runs ARGV, and records the exit code (and signal) in STATE_DIR/exit.json when
it ends (the file names: config/run_layout.py), so `kaiyuan status` can tell finished from failed from stopped.

A stop is SIGTERM to the supervisor, which hands it to the training ranks only — the children of each
torchrun agent below it. Not to the whole group: torchrun answers SIGTERM by killing its ranks 30 s later
(whether or not their checkpoint is written), and the ranks' DataLoader workers die on it, which fails the
rank on its next batch. Megatron's exit-signal handler in each rank saves and exits; torchrun and the
launcher then end on their own. `kaiyuan train` in the foreground does the same with a SIGTERM it gets
(run_foreground).

The supervisor holds the run's lock and hands its token to everything below it (launch/membership.py); its child
and torchrun get SIGTERM when their parent dies, so a supervisor killed by anything ends its run rather than
leaving it to train unsupervised. Which processes are the run's, and the verbs a node runs for `kaiyuan stop` /
`status` (node_verb), go by that token and lock, never by a command line."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.config.run_layout import CHILD_PID_FILE, EXIT_FILE, IDENTITY_FILE, PHASE_FILE, STOP_FILE
from kaiyuan_recipes.launch import membership
from kaiyuan_recipes.launch.failure import last_exception
from kaiyuan_recipes.launch.identity import IdentityError, ProcessIdentity
from kaiyuan_recipes.launch.run import RunError
from kaiyuan_recipes.launch.run_records import RunStateError, read_exit, read_object
from kaiyuan_recipes.processes import processes
from kaiyuan_recipes.run_states import Phase, RunState

SUPERVISED_ENV = "KAIYUAN_SUPERVISED"  # set for the command a supervisor runs: it records nothing itself

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
TAIL_LINES = 2000
HELD_LINES = 500  # more than torchrun's report of a stopped set-up: past it, the run is doing something else


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


def run_foreground(argv: list[str], log_path: Path, on_stop: Callable[[], None] | None = None,
                   state_dir: Path | None = None) -> int:
    """Run `argv` (torchrun) in the foreground, its output to stdout and `log_path`; a SIGTERM to this
    process (a scheduler's, `timeout`'s) is handed to the ranks as `kaiyuan stop` would, so they save a
    checkpoint and exit instead of being killed by torchrun (`on_stop` is called first). A stop that ended the
    run before its first step (the phase in `state_dir` still set-up: the ranks end at once, nothing to save)
    says so and counts as a clean end (0), as a stop during training does; torchrun's report of the ranks that
    signal ended (a ChildFailedError traceback) then goes to the log only. A failure ends with one line naming its
    cause (torchrun's own report above it says only that a child failed) and where the logs are."""

    proc: subprocess.Popen | None = None
    pending: list[bool] = []
    stopped: list[bool] = []

    def stop(*_: Any) -> None:
        stopped.append(True)
        if on_stop is not None:
            try:
                on_stop()
            except OSError as err:  # the record is for status; the stop itself must still go through
                print(f"kaiyuan: could not record the stop: {err}", file=sys.stderr, flush=True)
        if proc is None:
            pending.append(True)
        else:
            forward_stop(proc.pid)

    def stopped_in_set_up() -> bool:
        # under a supervisor the stop reaches the ranks, not this process: `kaiyuan stop` records it first
        asked = stopped or (state_dir is not None and (Path(state_dir) / STOP_FILE).is_file())
        return bool(asked) and state_dir is not None and _still_setting_up(state_dir)

    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)  # where a failure's cause is
    held: list[str] | None = None  # console lines after a stop during set-up, until the run's end says what they are
    previous = signal.signal(signal.SIGTERM, stop)  # before the child exists: an early SIGTERM still stops it
    # torchrun and the ranks write to the log file itself, never to a pipe to this process: a rank's output must not
    # depend on a reader staying alive. With this process gone (its process group killed) a rank's first print on
    # its way to the save would otherwise die of EPIPE: Megatron-Bridge prints "saving checkpoint at iteration"
    # before it writes. This process follows the file to the console.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o666)
    with open(fd, "a", encoding="utf-8") as log, open(log_path, "rb", buffering=0) as written:
        # torchrun gets SIGTERM when this process dies, however it dies: it then ends its ranks (launch/membership.py)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=membership.dies_with_this_process(signal.SIGTERM))
        if pending:
            forward_stop(proc.pid)
        try:
            for line in follow(written, proc):
                tail.append(line)
                if held is None and stopped_in_set_up():  # what follows is torchrun reporting the ranks it lost
                    held = []
                if held is not None:
                    held.append(line)
                    if len(held) < HELD_LINES and stopped_in_set_up():
                        continue
                    sys.stdout.writelines(held)  # the run went on after all: nothing is left out
                    held = None
                else:
                    sys.stdout.write(line)
                sys.stdout.flush()
            code = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if code != 0 and stopped_in_set_up():
            cause = last_exception("".join(held or []))  # a rank's own error that came with the stop, not torchrun's
            line = (f"kaiyuan: a rank reported, as the stop came: {cause}\n" if cause else "") + \
                "kaiyuan: stopped before its first step; nothing to save, no checkpoint written\n"
            sys.stdout.write(line)
            log.write(line)
            return 0
        sys.stdout.writelines(held or [])
        if code != 0:
            line = failure_line(code, "".join(tail), log_path)
            sys.stdout.write(line)
            log.write(line)
        return code


def follow(written: Any, proc: subprocess.Popen, poll: float = 0.05) -> Iterator[str]:
    """The lines of the file `written` (opened unbuffered for reading) as `proc` writes them, until it has ended and
    every line it wrote is read."""
    partial = b""
    while True:
        ended = proc.poll() is not None  # asked before the read: everything it wrote before it ended is read next
        chunk = written.read(1 << 16)
        if chunk:
            *lines, partial = (partial + chunk).split(b"\n")
            yield from (line.decode("utf-8", "replace") + "\n" for line in lines)
        elif ended:
            break
        else:
            time.sleep(poll)
    if partial:
        yield partial.decode("utf-8", "replace")


def failure_line(code: int, output: str, log_path: Path) -> str:
    """The last words of a failed run: its cause, and where its whole output and every upstream record are."""
    how = f"ended by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else \
        f"failed (exit {code})"
    cause = last_exception(output)
    return (f"kaiyuan: training {how}" + (f": {cause}" if cause else "") + f"\nkaiyuan: its output: {log_path}; "
            f"every upstream log record: {log_path.parent / 'upstream.rank<R>.log'}\n")


def _still_setting_up(state_dir: Path) -> bool:
    try:
        record = read_object(Path(state_dir) / PHASE_FILE, {"phase": (str,)})
    except RunError:
        return False
    return record is None or Phase.is_setting_up(record["phase"])


@dataclass(frozen=True)
class Alive:
    """What of a run is alive: its recorded supervisor (when that very process runs and holds the run's lock) and
    every process of the run (launch/membership.py), the supervisor included."""
    supervisor: int | None
    processes: tuple[int, ...]
    state_dir: Path

    @property
    def also(self) -> tuple[int, ...]:
        return (self.supervisor,) if self.supervisor else ()

    @property
    def state(self) -> RunState | None:
        """RUNNING / SUPERVISOR_LOST, or None when nothing of the run is alive."""
        if self.supervisor:
            return RunState.RUNNING
        return RunState.SUPERVISOR_LOST if self.processes else None


def run_alive(state_dir: Path) -> Alive:
    """What of the run recorded in `state_dir` is alive now (an IdentityError for a supervisor record that kaiyuan
    would not have written)."""
    state_dir = Path(state_dir).resolve()
    identity = ProcessIdentity.load(state_dir / IDENTITY_FILE)
    recorded = (identity.pid,) if identity is not None and identity.is_alive() else ()
    processes = tuple(membership.members(state_dir, also=recorded))
    supervisor = recorded[0] if recorded and recorded[0] in processes else None
    return Alive(supervisor, processes, state_dir)


def running_pid(state_dir: Path) -> int | None:
    """While anything of the run recorded in `state_dir` is alive: its supervisor, or with the supervisor gone a
    process of the run that is still alive; None when nothing is. Every back-end asks it before starting in a run
    directory (a run on this node there would interleave two trainings)."""
    try:
        alive = run_alive(state_dir)
    except IdentityError as err:
        raise RunStateError(str(err)) from None
    return alive.supervisor or (alive.processes[0] if alive.processes else None)


def live_supervisor(state_dir: Path) -> ProcessIdentity | None:
    """The supervisor recorded in `state_dir` while that very process runs this run."""
    alive = run_alive(state_dir)
    return ProcessIdentity.of(alive.supervisor) if alive.supervisor else None


def terminate(alive: Alive) -> list[int]:
    """A stop: SIGTERM to the live supervisor, which hands it to the ranks; with the supervisor gone, to the ranks
    below each of the run's top processes (the orphaned launcher or torchrun agent) directly. Returns whom."""
    if alive.supervisor:
        sent = membership.signal_member(alive.supervisor, alive.state_dir, signal.SIGTERM, alive.also)
        return [alive.supervisor] if sent else []
    mine = set(alive.processes)
    table = processes()
    tops = [pid for pid in alive.processes if pid in table and table[pid].ppid not in mine]
    targets = sorted({rank for top in tops for rank in training_ranks(top) if rank in mine})
    return [pid for pid in targets if membership.signal_member(pid, alive.state_dir, signal.SIGTERM)]


def kill_all(state_dir: Path, rounds: int = 20, pause: float = 0.1) -> bool:
    """SIGKILL every process of the run (each one checked as the run's right before); True when any was sent."""
    sent = False
    for _ in range(rounds):  # a process may start another while we kill: look again, a bounded number of times
        try:
            alive = run_alive(state_dir)
        except IdentityError:  # a damaged supervisor record must not spare the rest of the run
            resolved = Path(state_dir).resolve()
            alive = Alive(None, tuple(membership.members(resolved)), resolved)
        if not alive.processes:
            break
        for pid in alive.processes:
            sent |= membership.signal_member(pid, alive.state_dir, signal.SIGKILL, alive.also)
        time.sleep(pause)
    return sent


def record_exit(state_dir: Path, code: int) -> None:
    record = {"exit_code": code, "signal": -code if code < 0 else None, "ended_at": time.time()}
    write_text_atomic(Path(state_dir) / EXIT_FILE, json.dumps(record))


def node_verb(verb: str, state_dir: Path) -> int:
    """What `kaiyuan stop` / `status` run on a node against the node's state folder: --term (a stop: SIGTERM to
    the supervisor, or to the ranks when it is gone), --kill (SIGKILL to every process of the run), --status (one
    JSON line: the live supervisor, every live process of the run, the exit record)."""
    try:
        alive = run_alive(state_dir)
        if verb == "--status":
            exit_info = read_exit(Path(state_dir) / EXIT_FILE)
            phase = read_object(Path(state_dir) / PHASE_FILE, {"phase": (str,)})
            print(json.dumps({"supervisor": alive.supervisor, "alive": list(alive.processes), "exit": exit_info,
                              "phase": phase and phase["phase"]}))
            return 0
    except (IdentityError, RunError) as err:
        print(f"kaiyuan supervisor: {err}", file=sys.stderr)
        return 3
    if not alive.processes:
        print(f"kaiyuan supervisor: {state_dir}: nothing of the run is alive; nothing signalled", file=sys.stderr)
        return 3
    sent = bool(terminate(alive)) if verb == "--term" else kill_all(state_dir)
    return 0 if sent else 3


USAGE = ("usage: python -m kaiyuan_recipes.launch.supervise [--new-session] STATE_DIR -- ARGV...\n"
         "       python -m kaiyuan_recipes.launch.supervise --term|--kill|--status STATE_DIR")


def _claim(state_dir: Path) -> membership.Claim:
    """The run's lock: handed over by `kaiyuan start` (LOCK_FD_ENV), or taken here (a node of a multi-node run)."""
    handed = os.environ.pop(membership.LOCK_FD_ENV, None)
    if handed is not None:
        return membership.inherited_claim(state_dir, int(handed))
    claim = membership.claim(state_dir, f"{state_dir}: a run is still alive here")
    (Path(state_dir) / PHASE_FILE).unlink(missing_ok=True)
    return claim


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
    try:
        claim = _claim(state_dir)
    except RunError as err:
        print(f"kaiyuan supervisor: {err}", file=sys.stderr)
        return 3
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
    # The child and everything below carry the run's token (how stop and status know them) and get SIGTERM when
    # this supervisor dies (kill -9, OOM): the run ends with it instead of training on unsupervised.
    env = dict(os.environ, **{SUPERVISED_ENV: str(state_dir)}, **claim.env())
    child = subprocess.Popen(command, env=env, preexec_fn=membership.dies_with_this_process(signal.SIGTERM))
    if stop_pending:
        forward_stop(child.pid)
    write_text_atomic(state_dir / CHILD_PID_FILE, str(child.pid))
    code = child.wait()
    record_exit(state_dir, code)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
