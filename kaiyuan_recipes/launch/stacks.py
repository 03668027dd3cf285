"""Where a running run's ranks are, without a debugger: each rank registers Python's faulthandler on SIGUSR1
(enable_stack_dumps, the first thing training/entry.py does); `kaiyuan stacks RUN` sends SIGUSR1 to the ranks
that registered it and prints what they wrote to the run's log. For a run that stalls (no new step, no error):
a collective one rank never joined, a checkpoint load, a compile."""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from pathlib import Path

from kaiyuan_recipes.launch.lifecycle import RunPaths, RunStateError, running_pid
from kaiyuan_recipes.launch.supervise import training_ranks

STACK_SIGNAL = signal.SIGUSR1


def enable_stack_dumps() -> None:
    """Dump every thread's Python stack to stderr on SIGUSR1 (in C: works while Python waits in a kernel)."""
    faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)


def catches(pid: int, sig: int) -> bool:
    """Whether `pid` handles `sig` (/proc/PID/status SigCgt): only those get it, the default would kill them."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:  # exited meanwhile
        pass
    return False


def dump_stacks(run_dir: Path, timeout: float = 10.0, quiet: float = 0.5) -> tuple[list[int], str]:
    """SIGUSR1 to the run's ranks that dump stacks; returns their pids and what the log gained (until it has
    been quiet for `quiet` seconds, at most `timeout`)."""
    paths = RunPaths(Path(run_dir))
    pid = running_pid(paths)
    if pid is None:
        raise RunStateError(f"run {paths.run_dir.name!r} is not running")
    ranks = [r for r in training_ranks(pid) if catches(r, STACK_SIGNAL)]
    if not ranks:
        raise RunStateError(f"run {paths.run_dir.name!r}: no rank handles SIGUSR1 yet (still starting, or started "
                            "by a version without stack dumps)")
    start = paths.log.stat().st_size
    for rank in ranks:
        try:
            os.kill(rank, STACK_SIGNAL)
        except ProcessLookupError:
            pass
    size, changed, deadline = start, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = paths.log.stat().st_size
        if now != size:
            size, changed = now, time.monotonic()
        elif size > start and time.monotonic() - changed >= quiet:
            break
    with open(paths.log, "rb") as log:
        log.seek(start)
        return ranks, log.read(size - start).decode(errors="replace")
