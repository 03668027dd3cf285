"""One resolved plan per launch. Rank 0 resolves the recipe on the training node (every `auto` decided for the
hardware that trains), writes the plan once to <run>/run_state/plan.json (config/plan_file.py says the format)
and hands it to the other ranks through torchrun's own store (the one its ranks rendezvous through, on every node:
no shared file system needed, and never a plan left by an earlier launch). The other ranks build the same
container with the plan's decisions taken, not decided again, and say so if theirs differs anywhere else.

A host that only launches (an SSH or Slurm login node) builds with decide_here=False: its dry run shows the
layer spec and fast path as decided on the training node."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any, Mapping

from kaiyuan_recipes import compat
from kaiyuan_recipes.config.plan_file import NODE_DECIDES, PLAN_FORMAT, plan_digest, write_plan
from kaiyuan_recipes.fastpath.decisions import FastPathPlan, Piece
from kaiyuan_recipes.training.config import NodeDecisions, RunSettings, build_config

# How long a rank waits for rank 0's plan: rank 0 may first prepare the sample corpus or read a large tokenizer.
# torchrun ends the waiting ranks when rank 0 fails, and a stop ends them (training/run_phase.py).
PLAN_WAIT = timedelta(minutes=30)


def layer_spec_reason(run: RunSettings) -> str:
    """Why the layer spec is what it is, in the terms of models/providers.py resolve_layer_spec."""
    if run.decided == "node":
        return NODE_DECIDES
    if run.layer_spec_knob != "auto":
        return f"kaiyuan.layer_spec={run.layer_spec_knob}"
    if run.layer_spec == "transformer_engine":
        return "auto: Transformer Engine imports"
    if run.layer_spec == "fast":
        return "auto: no Transformer Engine, a CUDA host"
    return "auto: deterministic" if run.deterministic else "auto: no Transformer Engine, no CUDA"


def host_facts() -> dict[str, Any]:
    import socket

    import torch

    return {"host": socket.gethostname(), "cuda": torch.cuda.is_available(),
            "transformer_engine": compat.transformer_engine_available()}


def plan_record(cfg: Any, run: RunSettings, overrides: list[str], world_size: int) -> dict[str, Any]:
    """The resolved plan of this run as plain data (config/plan_file.py's format)."""
    on_node = run.decided == "node"
    knobs = run.knob_values() | {"layer_spec": run.layer_spec_knob}
    return {
        "format": PLAN_FORMAT,
        "recipe": run.recipe,
        "overrides": list(overrides),
        "world_size": world_size,
        "decided": {"where": "node" if on_node else "this host", **({} if on_node else host_facts())},
        "layer_spec": {"knob": run.layer_spec_knob, "decided": NODE_DECIDES if on_node else run.layer_spec,
                       "why": layer_spec_reason(run)},
        "fast_path": NODE_DECIDES if on_node or run.fastpath is None else
        {name: {"on": p.on, "reason": p.reason} for name, p in run.fastpath.pieces.items()},
        "sdpa_backend": run.sdpa_backend,
        "knobs": knobs,
        "container": json.loads(json.dumps(cfg.to_dict(), default=plain_value)),
    }


def plain_value(value: Any) -> str:
    """A value JSON has no type for, as text that is the same in every process: functions and classes (an
    activation, a layer spec) by their import path, as Megatron-Bridge's run_config.yaml names them; never a repr
    with a memory address."""
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and name and (callable(value) or isinstance(value, type)):
        return f"{module}.{name}"
    return str(value)


# Fields that differ between the ranks of one plan by design (each rank's own place on its node).
PER_RANK_FIELDS = ("container.dist.local_rank",)


def decisions_from(record: Mapping[str, Any]) -> NodeDecisions:
    pieces = {name: Piece(bool(p["on"]), str(p["reason"])) for name, p in record["fast_path"].items()}
    return NodeDecisions(layer_spec=record["layer_spec"]["decided"],
                         fastpath=FastPathPlan(pieces=pieces, sdpa_backend=record["sdpa_backend"]))


def differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys where two plain-data trees differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


def _launch_store(env: Mapping[str, str]) -> Any:
    """torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE: the elastic agent serves it at MASTER_ADDR:PORT for
    this launch), or None outside torchrun."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env:
        return None
    from torch.distributed import TCPStore

    return TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=PLAN_WAIT)


def resolve_for_rank(recipe: str, overrides: list[str], env: Mapping[str, str] = os.environ,
                     check: Any = None) -> tuple[Any, RunSettings, dict[str, Any]]:
    """This rank's config and the run's plan. Rank 0 (or a single process) resolves, runs `check(cfg, run)`, writes
    the plan file and publishes it; every other rank takes the published plan's decisions."""
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    store = _launch_store(env) if world_size > 1 else None
    # per torchrun restart: a restarted launch resolves again
    key = f"kaiyuan/plan/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if rank == 0 or store is None:
        cfg, run = build_config(recipe, overrides)
        if check is not None:
            check(cfg, run)
        record = plan_record(cfg, run, overrides, world_size)
        if rank == 0:
            write_plan(run.run_dir, record)
        if store is not None:
            store.set(key, json.dumps(record))
        return cfg, run, record
    record = json.loads(store.get(key))
    cfg, run = build_config(recipe, overrides, decided=decisions_from(record))
    if check is not None:
        check(cfg, run)
    mine = plan_record(cfg, run, overrides, world_size)
    differ = [k for k in differences(record, mine) if not k.startswith("decided") and k not in PER_RANK_FIELDS]
    if differ:
        print(f"kaiyuan: rank {rank}: this node's config differs from the run's plan (rank 0's) at "
              f"{', '.join(differ[:8])}{' ...' if len(differ) > 8 else ''}", file=sys.stderr, flush=True)
    return cfg, run, record


def plan_line(record: dict[str, Any], rank: int) -> str:
    """The line each rank prints: the plan it trains with (the fingerprint of run_state/plan.json)."""
    return (f"kaiyuan: rank {rank} trains with plan {plan_digest(record)} (layer spec "
            f"{record['layer_spec']['decided']}, decided on {record['decided'].get('host', 'the node')})")
