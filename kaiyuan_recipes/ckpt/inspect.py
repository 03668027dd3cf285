"""`kaiyuan ckpt inspect`: what one checkpoint holds and was trained with, from its metadata and
run_config.yaml alone (no tensor data read, no model built)."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaiyuan_recipes.ckpt import regions, store
from kaiyuan_recipes.config.run_layout import RunLayout

# The model.yaml fields that tell recipes apart (a recipe is the model file plus its hparams).
RECIPE_SHAPE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "vocab_size", "num_moe_experts")
MODEL_FIELDS = RECIPE_SHAPE + ("seq_length", "qk_layernorm", "normalization", "gated_linear_unit",
                               "share_embeddings_and_output_weights", "position_embedding_type", "rotary_base")
WRITER_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's FileSystemWriter: __{rank}_{n}.distcp


@dataclass
class TensorInfo:
    key: str
    shape: list[int]
    dtype: str
    numel: int
    bytes: int
    chunks: int  # stored pieces (one per saving rank and bucket range)


@dataclass
class TensorGroup:
    name: str
    tensors: int
    parameters: int
    bytes: int
    dtypes: list[str]


@dataclass
class ParallelLayout:
    tensor: int | None
    pipeline: int | None
    context: int | None
    expert: int | None
    data: int | None  # writer ranks / (TP·PP·CP): every rank of the distributed optimizer writes its shard
    zero_stage: int | None
    optimizer_sharding: str | None  # megatron-core's distrib_optim_sharding_type
    writer_ranks: int  # ranks that wrote shard files


@dataclass
class LoadTargets:
    resume_other_dp: bool
    resume_other_tp_pp: bool
    export_hf: bool
    reasons: list[str]


@dataclass
class CheckpointReport:
    path: str
    iteration: int | None
    format: str
    disk_bytes: int
    recipe: str | None
    recipe_source: str
    model: dict[str, Any]
    knobs: dict[str, Any]
    train_state: dict[str, Any] | None
    layout: ParallelLayout
    loadable: LoadTargets
    groups: list[TensorGroup]
    objects: list[str]  # non-tensor entries (RNG, common state, extra state)
    tensors: list[TensorInfo] = field(default_factory=list)  # those matching --tensors
    # the run's resolved plan (run_state/plan.json, its latest launch; config/plan_file.py plan_brief), if any
    run_plan: dict[str, Any] | None = None


def group_of(key: str) -> str:
    """decoder.layers.mlp.linear_fc1.weight -> decoder.layers.mlp; optimizer buckets by state (param, exp_avg);
    a ShardedObject ('rng_state/shard_0.0_1.1') by its name."""
    key = key.split("/", 1)[0]
    if key.startswith("optimizer."):
        last = key.rsplit(".", 1)[-1]
        return "optimizer." + ("param_groups" if last == "optimizer" else last)
    parts = key.split(".")
    if parts[:2] == ["decoder", "layers"]:
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if parts[0] == "decoder" else parts[0]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_infos(metadata: Any) -> list[TensorInfo]:
    out = []
    for key, md in regions.tensor_entries(metadata).items():
        numel = 1
        for s in md.size:
            numel *= s
        out.append(TensorInfo(key, list(md.size), _dtype_name(md.properties.dtype), numel,
                              numel * md.properties.dtype.itemsize, len(md.chunks)))
    return out


def group_tensors(infos: list[TensorInfo]) -> list[TensorGroup]:
    groups: dict[str, TensorGroup] = {}
    for t in infos:
        g = groups.setdefault(group_of(t.key), TensorGroup(group_of(t.key), 0, 0, 0, []))
        g.tensors += 1
        g.parameters += t.numel
        g.bytes += t.bytes
        if t.dtype not in g.dtypes:
            g.dtypes.append(t.dtype)
    return list(groups.values())


def match_tensors(infos: list[TensorInfo], pattern: str) -> list[TensorInfo]:
    """A glob (`*mlp*weight`); without wildcards, a substring."""
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    return [t for t in infos if fnmatch.fnmatchcase(t.key, pattern)]


def zero_stage(config: dict[str, Any] | None) -> int | None:
    """The kaiyuan.zero_stage whose Megatron settings the recorded config has (training.config.ZERO_STAGES)."""
    from kaiyuan_recipes.training.config import ZERO_STAGES

    ddp, opt, dist = (store.section(config, s) for s in ("ddp", "optimizer", "dist"))
    recorded = {"use_distributed_optimizer": opt.get("use_distributed_optimizer"),
                "data_parallel_sharding_strategy": ddp.get("data_parallel_sharding_strategy"),
                "use_megatron_fsdp": dist.get("use_megatron_fsdp")}
    return next((stage for stage, want in ZERO_STAGES.items() if want == recorded), None)


def find_recipe(ckpt: Path, model: dict[str, Any]) -> tuple[str | None, str]:
    """The recipe `kaiyuan train` recorded for the run (run_state/command.json), else the shipped recipe
    whose model file has this shape."""
    root = ckpt.parent
    if root.name == "checkpoints":
        command = RunLayout(root.parent).command
        if command.is_file():
            try:
                recipe = json.loads(command.read_text()).get("recipe")
            except ValueError:
                recipe = None
            if recipe:
                return recipe, str(command)
    from kaiyuan_recipes.config.recipe_tree import known_recipes, load_model_file

    for name in known_recipes():
        shipped = load_model_file(name)
        if all(shipped.get(k) == model.get(k) for k in RECIPE_SHAPE):
            return name, f"model shape equals recipes/{name}'s model file"
    return None, "no run_state/command.json, and the shape is no shipped recipe's (overridden)"


def _precision(recorded: Any, model: dict[str, Any]) -> str | None:
    """A recipe's name for it ('bf16_mixed') as recorded before start-up, or the resolved config's flags."""
    if isinstance(recorded, str):
        return recorded
    flags = recorded if isinstance(recorded, dict) else model
    return "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else "fp32"


def _knobs(config: dict[str, Any] | None) -> dict[str, Any]:
    model, train, opt, sched, ckpt = (store.section(config, s) for s in
                                      ("model", "train", "optimizer", "scheduler", "checkpoint"))
    spec = (model.get("transformer_layer_spec") or {})
    return {
        "layer_spec": spec.get("_target_", "").rsplit(".", 1)[-1] if isinstance(spec, dict) else str(spec),
        "zero_stage": zero_stage(config),
        "cuda_graph_impl": model.get("cuda_graph_impl"),
        "gradient_accumulation_fusion": model.get("gradient_accumulation_fusion"),
        "mixed_precision": _precision((config or {}).get("mixed_precision"), model),
        "global_batch_size": train.get("global_batch_size"), "micro_batch_size": train.get("micro_batch_size"),
        "train_iters": train.get("train_iters"),
        "lr": opt.get("lr"), "min_lr": opt.get("min_lr"), "weight_decay": opt.get("weight_decay"),
        "lr_decay_style": sched.get("lr_decay_style"), "lr_warmup_iters": sched.get("lr_warmup_iters"),
        "save_interval": ckpt.get("save_interval"), "most_recent_k": ckpt.get("most_recent_k"),
        "ckpt_format": ckpt.get("ckpt_format"),
    }


CONTENT_METADATA = "content_metadata"  # megatron-core's key for save(..., content_metadata=...) in the common state


def _optimizer_sharding(ckpt: Path, metadata: Any, fmt: str, has_optimizer: bool) -> str | None:
    if not has_optimizer or fmt != "torch_dist":
        return "fsdp_dtensor" if has_optimizer else None
    meta = (regions.common_state(ckpt, metadata) or {}).get(CONTENT_METADATA) or {}
    return meta.get("distrib_optim_sharding_type") or "per-parameter (no distributed optimizer)"


def load_targets(fmt: str, has_optimizer: bool, sharding: str | None) -> LoadTargets:
    reasons = []
    if fmt == "fsdp_dtensor":
        reasons += ["fsdp_dtensor: resumes under Megatron-FSDP only (kaiyuan.zero_stage=2)",
                    "export: `kaiyuan export hf` reads torch_dist only; retrain or save with kaiyuan.zero_stage=1"]
        return LoadTargets(False, False, False, reasons)
    if not has_optimizer:
        reasons.append("weights only: loads into any TP / PP / DP layout (no optimizer state to resume)")
        return LoadTargets(True, True, True, reasons + ["export: `kaiyuan export hf` reads it"])
    if sharding == "dp_reshardable":
        reasons += ["distributed optimizer, dp_reshardable: resume with another DP size, same TP / PP "
                    "(megatron-core reshards this format in DP only)",
                    "another TP / PP: load the weights without the optimizer (checkpoint.load_optim=false), or save "
                    "with checkpoint.dist_ckpt_optim_fully_reshardable=true"]
        other_tp_pp = False
    else:
        reasons.append(f"optimizer state {sharding}: megatron-core reshards it to any TP / PP / DP")
        other_tp_pp = True
    return LoadTargets(True, other_tp_pp, True, reasons + ["export: `kaiyuan export hf` reads it"])


def inspect_checkpoint(path: Path, tensor_pattern: str | None = None) -> CheckpointReport:
    ckpt = store.resolve_checkpoint(path)
    fmt = store.checkpoint_format(ckpt)
    metadata = store.read_dcp_metadata(ckpt)
    config = store.read_run_config(ckpt)
    infos = tensor_infos(metadata)
    has_optimizer = any(t.key.startswith("optimizer.") for t in infos)
    model_cfg = store.section(config, "model")
    model = {k: model_cfg.get(k) for k in MODEL_FIELDS if model_cfg.get(k) is not None}
    model["parameters"] = sum(t.numel for t in infos if not t.key.startswith("optimizer."))
    recipe, source = find_recipe(ckpt, model) if model_cfg else (None, f"no {store.RUN_CONFIG} in {ckpt}")
    sharding = _optimizer_sharding(ckpt, metadata, fmt, has_optimizer)
    writers = {int(m.group(1)) for p in ckpt.iterdir() if (m := WRITER_FILE.match(p.name))}
    tp, pp, cp = (model_cfg.get(k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                             "context_parallel_size"))
    # run_config.yaml records no world size (dataset.data_parallel_size stays 1). Each rank of the distributed
    # optimizer owns a distinct optimizer shard, so it writes a file; other saves may leave ranks idle.
    data = len(writers) // ((tp or 1) * (pp or 1) * (cp or 1)) if sharding == "dp_reshardable" else None
    layout = ParallelLayout(
        tensor=tp, pipeline=pp, context=cp, expert=model_cfg.get("expert_model_parallel_size"), data=data,
        zero_stage=zero_stage(config) if config else None, optimizer_sharding=sharding, writer_ranks=len(writers))
    objects = regions.bytes_entries(metadata)
    return CheckpointReport(
        path=str(ckpt), iteration=store.iteration_of(ckpt), format=fmt, disk_bytes=store.disk_bytes(ckpt),
        recipe=recipe, recipe_source=source, model=model, knobs=_knobs(config) if config else {},
        train_state=store.read_train_state(ckpt), layout=layout, loadable=load_targets(fmt, has_optimizer, sharding),
        groups=group_tensors(infos), objects=objects,
        tensors=match_tensors(infos, tensor_pattern) if tensor_pattern else [], run_plan=run_plan_of(ckpt))


def run_plan_of(ckpt: Path) -> dict[str, Any] | None:
    """The plan of the run whose checkpoints/ holds `ckpt`, briefly, with the file it is read from."""
    from kaiyuan_recipes.config.plan_file import plan_brief, read_plan

    root = Path(ckpt).parent
    record = read_plan(root.parent) if root.name == "checkpoints" else None
    return None if record is None else {**plan_brief(record), "file": str(RunLayout(root.parent).plan)}
