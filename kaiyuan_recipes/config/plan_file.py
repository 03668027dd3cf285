"""The run's resolved plan on disk: <run>/run_state/plan.json, written once per launch by the rank that resolves it
(rank 0 on the training node, training/plan.py) and read by `kaiyuan status`, `kaiyuan ckpt inspect` and the
dry runs. Pure JSON: readable without torch or Megatron.

Format (PLAN_FORMAT 1), one JSON object:
  format, recipe, overrides (the command line's), world_size,
  decided: {where: "this host", host, cuda, transformer_engine} (where every `auto` was decided, and what that host
           had),
  layer_spec: {knob, decided, why}, fast_path: {piece: {on, reason}}, sdpa_backend,
  knobs: the kaiyuan.* values, stack: {package: version} (a rank with other versions is refused),
  container: Megatron-Bridge's ConfigContainer.to_dict() (non-JSON values as text; run_config.yaml beside it is the
  same container in Bridge's loadable form, which the other ranks load)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.config.run_layout import RunLayout, json_safe

PLAN_FORMAT = 1
NODE_DECIDES = "decided on the training node"  # what a launch host shows for the layer spec and fast path


class PlanFileError(ValueError):
    pass


def plan_text(record: dict[str, Any]) -> str:
    return json.dumps(json_safe(record), indent=1, sort_keys=True, default=str) + "\n"


def plan_digest(record: dict[str, Any]) -> str:
    """A short fingerprint of the plan (each rank prints the one it trains with)."""
    return hashlib.sha256(plan_text(record).encode()).hexdigest()[:12]


def write_plan(run_dir: Path, record: dict[str, Any]) -> Path:
    return write_text_atomic(RunLayout(Path(run_dir)).plan, plan_text(record), mode=0o600)


def read_plan(run_dir: Path) -> dict[str, Any] | None:
    """The run's plan (None before a launch wrote one); a damaged file is an error naming it."""
    path = RunLayout(Path(run_dir)).plan
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PlanFileError(f"{path}: not a plan file ({err})") from err
    if not isinstance(record, dict) or record.get("format") != PLAN_FORMAT:
        raise PlanFileError(f"{path}: expected a plan of format {PLAN_FORMAT}")
    return record


def plan_brief(record: dict[str, Any]) -> dict[str, Any]:
    """What `kaiyuan status` and `kaiyuan ckpt inspect` show of a plan: where `auto` was decided, the layer spec,
    the fast path's pieces that are on, and the file's fingerprint."""
    fast = record.get("fast_path")
    decided = record.get("decided") or {}
    return {
        "decided_on": decided.get("host") or decided.get("where"),
        "layer_spec": (record.get("layer_spec") or {}).get("decided"),
        "fast_path_on": sorted(k for k, v in fast.items() if v.get("on")) if isinstance(fast, dict) else fast,
        "world_size": record.get("world_size"),
        "digest": plan_digest(record),
    }


def node_decides_note(layer_spec_knob: str, run_dir: Path) -> str:
    """What a dry run on a launch host says instead of a layer spec and fast path decided there."""
    return (f"kaiyuan: layer spec and fast path: {NODE_DECIDES} (kaiyuan.layer_spec={layer_spec_knob}); its "
            f"rank 0 writes them to {RunLayout(Path(run_dir)).plan} (kaiyuan status shows them)")
