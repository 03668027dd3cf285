"""One handle on a run, whichever back-end runs it: start / stop / status / logs / stacks.

Back-ends: LocalRun (detached on this node, launch/lifecycle.py), MultiNodeRun (one torchrun per host over
SSH, launch/ssh.py) and SlurmRun (a Slurm job through NeMo-Run's SlurmExecutor, launch/slurm.py).
`kaiyuan start` picks the back-end from its flags; everything after that finds it from the run directory
through open_run (launch/backends.py), so the verbs never ask which."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.config.run_layout import RunLayout


class RunError(RuntimeError):
    """A run cannot do what was asked (not running, already running, unreadable state); one line for people."""


class Run(ABC):
    def __init__(self, run_dir: Path):
        self.layout = RunLayout(Path(run_dir))

    @property
    def run_dir(self) -> Path:
        return self.layout.run_dir

    @property
    def name(self) -> str:
        return self.run_dir.name

    @abstractmethod
    def start(self, argv: list[str], extra: dict[str, Any] | None = None) -> dict[int, int]:
        """Start `argv` detached (LocalRun: the command itself; MultiNodeRun: what torchrun runs on each node) and
        return each node's supervisor PID by node rank. `extra` is recorded with the command where the back-end
        keeps one. Refused while this run directory's previous run still runs."""

    @abstractmethod
    def stop(self, grace: float = 300.0) -> dict[str, Any]:
        """SIGTERM to what of the run is alive (its ranks save a checkpoint, or end at once still setting up),
        SIGKILL after `grace` seconds; what happened, as JSON. A RunError, signalling nothing, when nothing is
        alive."""

    @abstractmethod
    def stop_problems(self, result: dict[str, Any]) -> list[str]:
        """What in a stop's result needs a person (a SIGKILL, a node not reached); empty for a clean stop."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """As JSON: `state` (running / running — supervisor lost / lost / stopped / finished / failed, with the
        error), and what the back-end can tell beyond it (phase, iteration, nodes, the scheduler's view). `lost`:
        nothing of the run is alive, and it neither finished nor was stopped."""

    @abstractmethod
    def logs(self, follow: bool = False, out: TextIO | None = None) -> None:
        """Write the run's console output to `out` (default: stdout as it is at the call), with `follow` until the
        run ends where the back-end can."""

    @abstractmethod
    def stacks(self) -> str:
        """Every rank's Python stacks now (launch/stacks.py), as text for people."""
