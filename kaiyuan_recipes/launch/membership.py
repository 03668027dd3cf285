"""Which processes are one run, the lock that keeps a run directory to one run at a time, and the one that keeps a
run to one stop at a time (sole_stop).

A run claims its state folder (run_state/, or run_state/nodes/<rank>/ on each node of a multi-node run) before it
starts anything: a shared flock on run_state/run.lock, taken while nothing else holds it and nothing of the run
is alive, and a fresh random token in run_state/token. Its supervisor holds that lock for its whole life, and
every process below it carries the token and the state folder in its environment (KAIYUAN_RUN_TOKEN,
KAIYUAN_RUN_STATE); the training ranks take the shared lock too (join_run_from_env). The kernel drops a lock
when its last holder dies, however it dies, so a lock nobody holds means nothing of the run runs.

A process belongs to the run when its environment (/proc/PID/environ) names this state folder and its token, or
when it holds this folder's lock file open (the foreground `kaiyuan train` and a node's supervisor, which took
the lock themselves and so do not carry the token). Never by a command-line shape: a copy of a run directory
(`cp -r`) has the same token but another folder and another lock file, so nothing of the original is its.

Light on purpose: the training ranks import it (no torch)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.launch.run import RunError
from kaiyuan_recipes.launch.run_records import RunStateError, finite, read_stop

LOCK_FILE = "run.lock"
START_MUTEX_FILE = "start.lock"  # held only while a start checks and takes run.lock
TOKEN_FILE = "token"
TOKEN_ENV = "KAIYUAN_RUN_TOKEN"
STATE_ENV = "KAIYUAN_RUN_STATE"  # the run's state folder, resolved
LOCK_FD_ENV = "KAIYUAN_RUN_LOCK_FD"  # a supervisor handed the lock by `kaiyuan start` finds it here

PR_SET_PDEATHSIG = 1


class RunBusy(RunStateError):
    """Something of this run directory's run is still alive."""


@dataclass(frozen=True)
class Claim:
    fd: int  # holds the shared lock; inherited by whoever is handed it
    token: str
    state_dir: Path

    def env(self) -> dict[str, str]:
        return {TOKEN_ENV: self.token, STATE_ENV: str(self.state_dir)}


def lock_path(state_dir: Path) -> Path:
    return Path(state_dir) / LOCK_FILE


def read_token(state_dir: Path) -> str | None:
    try:
        token = (Path(state_dir) / TOKEN_FILE).read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None
    return token if token.isalnum() else None


def _open_lock(state_dir: Path) -> int:
    # never truncated or replaced: a lock lives on the file's inode, which every holder must share
    return os.open(lock_path(state_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def _try_flock(fd: int, how: int, attempts: int = 20, pause: float = 0.05) -> bool:
    """flock without blocking, a few times over a second (another process may hold it for a moment to test it)."""
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(pause)
    return False


def claim(state_dir: Path, busy_message: str) -> Claim:
    """Take `state_dir` for a new run: refused (RunBusy with `busy_message` and what is alive) while any process
    holds its lock or carries its token; else a shared lock held by the returned fd and a fresh token on record."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    mutex = os.open(state_dir / START_MUTEX_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        if not _try_flock(mutex, fcntl.LOCK_EX):
            raise RunBusy(f"{busy_message}: another start of it is under way")
        fd = _open_lock(state_dir)
        alive = members(state_dir)
        if alive or not _try_flock(fd, fcntl.LOCK_EX):
            os.close(fd)
            held = f"process(es) {alive} are alive" if alive else f"{lock_path(state_dir)} is held"
            raise RunBusy(f"{busy_message} ({held}); `kaiyuan stop` it first")
        fcntl.flock(fd, fcntl.LOCK_SH)  # under the mutex: no other start can slip in while it converts
        token = secrets.token_hex(16)
        write_text_atomic(state_dir / TOKEN_FILE, token, mode=0o600)
        return Claim(fd, token, state_dir)
    finally:
        os.close(mutex)  # releases it


class StopUnderWay(RunStateError):
    """Another stop of the run is under way."""


@contextlib.contextmanager
def sole_stop(layout: RunLayout, name: str) -> Iterator[None]:
    """Held by a stop of run `name` (any back-end) from its SIGTERM to its result. A second stop (a save under way, a
    shorter grace) would SIGKILL the save at its own deadline: it is refused (StopUnderWay), signalling nothing,
    saying when the one under way gives up waiting. The kernel drops the lock with its holder, however that dies."""
    layout.state.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(layout.stop_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise RunStateError(f"{layout.stop_lock}: cannot open the stop lock ({err.strerror})") from None
    try:
        if not _try_flock(fd, fcntl.LOCK_EX, attempts=1):
            raise StopUnderWay(_stop_under_way(layout, name))
        yield
    finally:
        os.close(fd)


def _stop_under_way(layout: RunLayout, name: str) -> str:
    try:
        asked = read_stop(layout) or {}
    except RunStateError:
        asked = {}
    at, grace = asked.get("requested_at", asked.get("at")), asked.get("grace_s")
    when = ""
    if finite(at) and finite(grace):
        clock = time.strftime("%H:%M:%S", time.localtime(at + grace))
        when = f" (by pid {asked.get('by_pid')}; it sends SIGKILL only if the run is still alive at {clock})"
    return (f"run {name!r}: a stop is already under way{when}; nothing signalled, its grace left as it is. "
            f"`kaiyuan status {name}` says when it has stopped")


def inherited_claim(state_dir: Path, fd: int) -> Claim:
    """The claim `kaiyuan start` took and handed to this supervisor as `fd`."""
    state_dir = Path(state_dir).resolve()
    token = read_token(state_dir)
    if token is None or not holds_lock(os.getpid(), state_dir):
        raise RunError(f"{state_dir}: the handed-over lock or token is missing")
    return Claim(fd, token, state_dir)


_JOINED: list[int] = []  # the rank's lock fd, kept open for the process's life


def join_run_from_env() -> None:
    """In a training rank: take the run's shared lock (its supervisor holds it), so the run counts as alive while
    this rank is, and die with the process that started it (torchrun): SIGTERM, which the rank answers as a stop.
    Leaves the process as it is outside a kaiyuan run (no token in the environment)."""
    token, state = os.environ.get(TOKEN_ENV), os.environ.get(STATE_ENV)
    if not token or not state:
        return
    die_with_parent(signal.SIGTERM, os.getppid())
    fd = _open_lock(Path(state))
    if not _try_flock(fd, fcntl.LOCK_SH, attempts=200):
        raise SystemExit(f"kaiyuan: {lock_path(Path(state))}: cannot take the run's lock")
    if read_token(Path(state)) != token:  # the run this rank was started for is gone and another took the folder
        raise SystemExit(f"kaiyuan: {state}: the run directory now belongs to another run; exiting")
    _JOINED.append(fd)


def _libc_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def die_with_parent(sig: int, parent: int) -> None:
    """Ask the kernel to send `sig` to this process when `parent` (the thread that forked it) dies; if the parent
    is already gone, send it now."""
    prctl = _libc_prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def dies_with_this_process(sig: int = signal.SIGTERM):
    """A Popen preexec_fn: the child gets `sig` when this process dies (kill -9 included). libc is looked up here,
    before the fork."""
    prctl, parent = _libc_prctl(), os.getpid()

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    wanted = (TOKEN_ENV.encode() + b"=", STATE_ENV.encode() + b"=")
    out = {}
    for entry in raw.split(b"\0"):
        if entry.startswith(wanted):
            key, _, value = entry.partition(b"=")
            out[key.decode()] = value.decode(errors="replace")
    return out


def carries_token(pid: int, state_dir: Path, token: str | None) -> bool:
    env = _environ(pid)
    return token is not None and env.get(TOKEN_ENV) == token and env.get(STATE_ENV) == str(state_dir)


def holds_lock(pid: int, state_dir: Path) -> bool:
    """Whether `pid` has this state folder's lock file open (the very file: same device and inode)."""
    try:
        target = os.stat(lock_path(state_dir))
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat.rsplit(b")", 1)[-1].split()[:1] == [b"Z"]


def is_member(pid: int, state_dir: Path, token: str | None, also: tuple[int, ...] = ()) -> bool:
    """`pid` runs and carries this run's token and folder, or is one of `also` holding its lock file open."""
    if _is_zombie(pid):
        return False
    return carries_token(pid, state_dir, token) or (pid in also and holds_lock(pid, state_dir))


def members(state_dir: Path, also: tuple[int, ...] = ()) -> list[int]:
    """Every live process of the run in `state_dir`: those carrying its token and folder in their environment,
    and those of `also` (a recorded supervisor) that hold its lock file open. This process never counts."""
    state_dir = Path(state_dir).resolve()
    token = read_token(state_dir)
    me = os.getpid()
    candidates = {int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()} if token else set()
    return sorted(pid for pid in candidates | set(also) if pid != me and is_member(pid, state_dir, token, also))


def signal_member(pid: int, state_dir: Path, sig: int, also: tuple[int, ...] = ()) -> bool:
    """Send `sig` to `pid` only while it is a process of this run: pinned through a pidfd first, so a PID reused
    between the check and the signal is never hit. True when sent."""
    state_dir = Path(state_dir).resolve()
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not is_member(pid, state_dir, read_token(state_dir), also):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)
