"""What `kaiyuan status` says of a run, named once for every back-end (launch/lifecycle.py, ssh.py, slurm.py), the
CLI and the ranks that write the phase: its state (RunState) and what it is doing or how it ended (Phase). Ground
floor, light: a rank writes its first phase before it imports anything heavy.

Both are str enums: a status record holds their words as plain JSON strings, and a record read back compares equal
to them."""

from __future__ import annotations

import enum


class RunState(enum.StrEnum):
    PENDING = "pending"  # a Slurm job the scheduler has not started yet
    RUNNING = "running"
    SUPERVISOR_LOST = "running — supervisor lost"  # processes of the run train on, their supervisor is gone
    LOST = "lost"  # nothing of it runs, and it neither finished nor was stopped
    STOPPED = "stopped"  # by `kaiyuan stop`, or a SIGTERM to a foreground `kaiyuan train`
    FINISHED = "finished"
    FAILED = "failed"
    UNREACHABLE = "unreachable"  # a node of a multi-node run that SSH cannot reach
    UNREADABLE = "unreadable"  # records kaiyuan would not have written (the error names the file)


ALIVE = (RunState.RUNNING, RunState.SUPERVISOR_LOST)  # something of the run runs: a start is refused, a stop signals


class Phase(enum.StrEnum):
    """run_state/phase.json (training/phase_file.py); set-up phases say which step: `setting up: building ...`."""
    SETTING_UP = "setting up"
    TRAINING = "training"
    SAVING = "saving"
    FINISHING = "finishing"
    STOPPED_BEFORE_FIRST_STEP = "stopped before its first step"  # status's word for a stop that came in set-up

    @staticmethod
    def is_setting_up(phase: str) -> bool:
        return phase.startswith(Phase.SETTING_UP)
