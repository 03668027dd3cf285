"""One resolved plan per launch. Rank 0 resolves the recipe on the training node (every `auto` decided for the
hardware that trains), writes the plan once to <run>/run_state/plan.json (config/plan_file.py says the format)
and hands it to the other ranks through torchrun's own store (the one its ranks rendezvous through, on every node:
the hand-off needs no shared file system, and never reads a plan left by an earlier launch). The other ranks load
that container (Megatron-Bridge's run_config.yaml form, also written to run_state/) instead of building one, after
checking that their stack is rank 0's; they install only what lives in the process itself (training/config.py
install_in_this_process) and point the bundled sample corpus at their node's cache. Data and a tokenizer the user
names are read at the same paths on every node.

A host that only launches (an SSH or Slurm login node) builds nothing: config/launch_request.py checks there."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

from kaiyuan_recipes import compat, fastpath
from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.config.plan_file import PLAN_FORMAT, plan_digest, write_plan
from kaiyuan_recipes.fastpath.decisions import FastPathPlan, Piece
from kaiyuan_recipes.training.config import (
    RunSettings,
    build_config,
    install_in_this_process,
    sample_corpus_on_this_node,
)

# The packages whose versions decide what a loaded container means: a rank whose stack differs is refused.
STACK = ("torch", "megatron-core", "megatron-bridge", "transformer-engine", "kaiyuan-recipes")
# RunSettings fields that stay with the process that built: rank 0's data verdict, the build's own bookkeeping.
BUILD_ONLY_FIELDS = ("data_check", "container_overrides")

# How long a rank waits for rank 0's plan: rank 0 may first prepare the sample corpus or read a large tokenizer.
# torchrun ends the waiting ranks when rank 0 fails, and a stop ends them (training/run_phase.py).
PLAN_WAIT = timedelta(minutes=30)


def layer_spec_reason(run: RunSettings) -> str:
    """Why the layer spec is what it is, in the terms of models/providers.py resolve_layer_spec."""
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
    knobs = run.knob_values() | {"layer_spec": run.layer_spec_knob}
    return {
        "format": PLAN_FORMAT,
        "recipe": run.recipe,
        "overrides": list(overrides),
        "world_size": world_size,
        "decided": {"where": "this host", **host_facts()},
        "layer_spec": {"knob": run.layer_spec_knob, "decided": run.layer_spec, "why": layer_spec_reason(run)},
        "fast_path": {name: {"on": p.on, "reason": p.reason} for name, p in run.fastpath.pieces.items()},
        "sdpa_backend": run.sdpa_backend,
        "knobs": knobs,
        "stack": stack_versions(),
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


def stack_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {name: installed(name) for name in STACK}


def run_settings_record(run: RunSettings) -> dict[str, Any]:
    """The run settings a loading rank needs, as plain data."""
    values = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.name not in BUILD_ONLY_FIELDS}
    values["run_dir"] = str(run.run_dir)
    if run.fastpath is not None:
        values["fastpath"] = {"pieces": {n: dataclasses.asdict(p) for n, p in run.fastpath.pieces.items()},
                              "sdpa_backend": run.fastpath.sdpa_backend}
    return values


def run_settings_from(values: Mapping[str, Any]) -> RunSettings:
    values = {**values, "run_dir": Path(values["run_dir"]), "decided": "plan"}
    if values.get("fastpath") is not None:
        plan = values["fastpath"]
        values["fastpath"] = FastPathPlan(pieces={n: Piece(**p) for n, p in plan["pieces"].items()},
                                          sdpa_backend=plan["sdpa_backend"])
    return RunSettings(**values)


def container_text(cfg: Any, run_dir: Path) -> str:
    """The container in Megatron-Bridge's run_config.yaml form (its own to_yaml), written to run_state/ once."""
    from kaiyuan_recipes.config.run_layout import RunLayout

    path = RunLayout(run_dir).plan_container
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        cfg.to_yaml(str(scratch))
        text = scratch.read_text(encoding="utf-8")
    finally:
        scratch.unlink(missing_ok=True)
    write_text_atomic(path, text, mode=0o600)
    return text


def load_container(text: str) -> Any:
    """A ConfigContainer from its run_config.yaml text, every field as the building process left it (strict: a key
    this stack does not know is an error, not dropped)."""
    import yaml

    fastpath.prepare_megatron_bridge()  # the upstream workarounds and our modules allowlisted for instantiation
    from megatron.bridge.training.config import ConfigContainer
    from megatron.training.config.instantiate_utils import InstantiationMode

    return ConfigContainer.from_dict(yaml.safe_load(text), mode=InstantiationMode.STRICT)


def refuse_another_stack(record: Mapping[str, Any], rank: int) -> None:
    """A rank whose stack is not rank 0's would read the same plan differently: refused, naming the packages."""
    import socket

    recorded, mine = record.get("stack") or {}, stack_versions()
    differ = [f"{name} {mine[name]} (rank 0: {recorded.get(name)})" for name in STACK
              if recorded.get(name) != mine[name]]
    if differ:
        raise ValueError(f"rank {rank} on {socket.gethostname()} has another stack than rank 0: {', '.join(differ)}; "
                         "install the same versions on every node")


def _launch_store(env: Mapping[str, str]) -> Any:
    """torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE: the elastic agent serves it at MASTER_ADDR:PORT for
    this launch), or None outside torchrun."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env:
        return None
    from torch.distributed import TCPStore

    return TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=PLAN_WAIT)


def resolve_for_rank(recipe: str, overrides: list[str], env: Mapping[str, str] = os.environ,
                     check: Any = None) -> tuple[Any, RunSettings, dict[str, Any]]:
    """This rank's config and the run's plan. Rank 0 (or a single process) resolves, runs `check(cfg, run)` (its
    verdict holds for every rank), writes the plan and its container, and publishes them; every other rank loads
    the published container."""
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
            hand_off = {"plan": record, "run": run_settings_record(run), "container": container_text(cfg, run.run_dir)}
            store.set(key, json.dumps(hand_off, default=str))
        elif rank == 0:
            container_text(cfg, run.run_dir)
        return cfg, run, record
    hand_off = json.loads(store.get(key))
    record = hand_off["plan"]
    refuse_another_stack(record, rank)
    cfg, run = load_container(hand_off["container"]), run_settings_from(hand_off["run"])
    sample_corpus_on_this_node(cfg, run)
    install_in_this_process(cfg, run)
    cfg.dist.local_rank = int(env.get("LOCAL_RANK", "0"))  # each rank's own place on its node
    return cfg, run, record


def plan_line(record: dict[str, Any], rank: int) -> str:
    """The line each rank prints: the plan it trains with (the fingerprint of run_state/plan.json)."""
    return (f"kaiyuan: rank {rank} trains with plan {plan_digest(record)} (layer spec "
            f"{record['layer_spec']['decided']}, decided on {record['decided'].get('host', 'the node')})")
