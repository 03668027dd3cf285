"""run_state/phase.json, what a run is doing now (training/run_phase.py decides; `kaiyuan status` reads it). Light:
a rank writes its first phase before it imports anything heavy."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.config.run_layout import PHASE_FILE
from kaiyuan_recipes.launch.membership import STATE_ENV
from kaiyuan_recipes.run_states import Phase


def is_phase_writer() -> bool:
    """Global rank 0 (torchrun's RANK; the process group may not exist yet during set-up)."""
    return os.environ.get("RANK", "0") == "0"


def supervised_state_dir() -> Path | None:
    """The state folder of the supervisor this rank runs under (its run_state/, or run_state/nodes/<rank>/ on a
    node of a multi-node run), where status looks for the phase; None outside `kaiyuan train` / `start`."""
    state = os.environ.get(STATE_ENV)
    return Path(state) if state else None


def write_phase(state_dir: Path, phase: str) -> None:
    if is_phase_writer():
        write_text_atomic(Path(state_dir) / PHASE_FILE, json.dumps({"phase": phase, "at": time.time()}))
        if Phase.is_setting_up(phase):
            print(f"kaiyuan: {phase}", flush=True)
