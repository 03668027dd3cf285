"""Where a running run's ranks are, without a debugger: each rank registers Python's faulthandler on SIGUSR1
(enable_stack_dumps, the first thing training/entry.py does); `kaiyuan stacks RUN` sends SIGUSR1 to the ranks
that registered it and prints what they wrote to the run's log. For a run that stalls (no new step, no error):
a collective one rank never joined, a checkpoint load, a compile. On each node of a multi-node job the same
runs over SSH: `python -m kaiyuan_recipes.launch.stacks NODE_STATE_DIR LOG` (launch/ssh.py). Light on purpose:
every training worker imports it, so it imports no back-end."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

from kaiyuan_recipes.launch.run import RunError
from kaiyuan_recipes.launch.supervise import training_ranks

STACK_SIGNAL = signal.SIGUSR1


def enable_stack_dumps() -> None:
    """Dump every thread's Python stack to stderr on SIGUSR1. A C signal handler writes it, so it works while
    the main thread is blocked in a C call (an NCCL wait, a CUDA synchronize)."""
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


def signal_and_read(supervisor: int, log: Path, timeout: float = 10.0, quiet: float = 0.5) -> tuple[list[int], str]:
    """SIGUSR1 to the ranks below `supervisor` that dump stacks; returns their pids and what `log` gained (until
    it has been quiet for `quiet` seconds, at most `timeout`)."""
    ranks = [r for r in training_ranks(supervisor) if catches(r, STACK_SIGNAL)]
    if not ranks:
        raise RunError(f"no rank below process {supervisor} handles SIGUSR1 yet (still starting, or started "
                            "by a version without stack dumps)")
    start = log.stat().st_size
    for rank in ranks:
        try:
            os.kill(rank, STACK_SIGNAL)
        except ProcessLookupError:
            pass
    size, changed, deadline = start, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = log.stat().st_size
        if now != size:
            size, changed = now, time.monotonic()
        elif size > start and time.monotonic() - changed >= quiet:
            break
    with open(log, "rb") as fh:
        fh.seek(start)
        return ranks, fh.read(size - start).decode(errors="replace")


def report(ranks: list[int], text: str) -> str:
    return f"==> SIGUSR1 to rank process(es) {ranks} <==\n{text}"


def main(argv: list[str] | None = None) -> int:
    from kaiyuan_recipes.launch.supervise import live_supervisor

    ap = argparse.ArgumentParser(description="stacks of the ranks below a node's supervisor, from its log (one node)")
    ap.add_argument("state_dir", type=Path, help="the node's run state (its supervisor's recorded identity)")
    ap.add_argument("log", type=Path)
    args = ap.parse_args(argv)
    try:
        supervisor = live_supervisor(args.state_dir)  # never a PID taken on trust from a state file
        if supervisor is None:
            raise RunError(f"{args.state_dir}: no live supervisor on record")
        ranks, text = signal_and_read(supervisor.pid, args.log)
    except (RunError, OSError, ValueError) as err:
        print(err, file=sys.stderr)
        return 1
    print(report(ranks, text), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
