"""Reading the records a run keeps in run_state/ (config/run_layout.py names them). They are input: a file kaiyuan would
not have written (cut short, edited, from another tool) is a RunStateError that names the file, never a traceback
and never a guess."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kaiyuan_recipes.config.run_layout import RunLayout, tracker_iteration
from kaiyuan_recipes.launch.run import RunError

NUMBER = (int, float)


class RunStateError(RunError):
    pass


def check_own_folders(layout: RunLayout) -> None:
    """A run's state and log folders are its own: one that is a symlink, or leads out of the run directory (planted by
    whoever can write the run root, or a link to another run's), is refused before anything is read, written or
    signalled through it; `status` and `stop` would otherwise act on whatever run it leads to."""
    root = layout.run_dir.resolve()
    for folder in (layout.state, layout.console_log.parent):
        if folder.is_symlink() or (folder.exists() and not folder.resolve().is_relative_to(root)):
            raise RunStateError(f"{folder}: a symlink or outside {root}, not this run's own folder; refused")


def read_object(path: Path, fields: dict[str, tuple[type, ...]] | None = None) -> dict[str, Any] | None:
    """The JSON object in `path` (None when there is no file), its `fields` checked for their types (a missing
    field is an error unless None is among its types)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunStateError(f"{path}: not a run record written by kaiyuan ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict):
        raise RunStateError(f"{path}: not a run record written by kaiyuan (expected a JSON object)")
    for name, types in (fields or {}).items():
        value = data.get(name)
        ok = isinstance(value, types) and not isinstance(value, bool) if value is not None else type(None) in types
        if not ok:
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunStateError(f"{path}: field {name!r} should be {wanted}, not {value!r:.60}")
    return data


def read_exit(path: Path) -> dict[str, Any] | None:
    """exit.json: how the supervisor's command ended."""
    return read_object(path, {"exit_code": (int,), "signal": (int, type(None))})


def read_command(layout: RunLayout) -> dict[str, Any]:
    """command.json ({} for a run without one)."""
    return read_object(layout.command, {"train_iters": (int, type(None))}) or {}


def read_phase(layout: RunLayout) -> str | None:
    record = read_object(layout.phase, {"phase": (str,)})
    return None if record is None else record["phase"]


def read_stop(layout: RunLayout) -> dict[str, Any] | None:
    return read_object(layout.stop_request)


def finite(value: Any) -> bool:
    return isinstance(value, NUMBER) and not isinstance(value, bool) and math.isfinite(value)


def last_checkpoint(layout: RunLayout, metrics: list[dict[str, Any]]) -> int | None:
    """The newest checkpoint the run saved: Megatron's tracker file, else the last checkpoint event it logged."""
    tracker = tracker_iteration(layout.checkpoints)
    if tracker is not None:
        return tracker
    saved = [r["iteration"] for r in metrics if r.get("event") == "checkpoint" and type(r.get("iteration")) is int]
    return saved[-1] if saved else None
