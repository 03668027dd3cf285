"""Assembles a Megatron-Bridge ConfigContainer from a recipe's three files plus overrides.

One function per concern: sections from YAML, ZeRO stage → DDP settings, run layout, data source.
Everything a recipe can say is a ConfigContainer field or a `kaiyuan.*` knob — nothing hidden here."""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kaiyuan_recipes import compat
from kaiyuan_recipes.models.providers import SDPA_BACKENDS, build_provider, resolve_layer_spec
from kaiyuan_recipes.recipe_tree import load_recipe_tree
from kaiyuan_recipes.training import overrides as ov

# Megatron's NullTokenizer appends EOD after the base vocabulary: with 151,643 base ranks the EOD id
# is 151,643, the same id <|endoftext|> has in the Qwen2 tokenizer.
QWEN2_BASE_VOCAB = 151643
# ZeRO stages in Megatron's terms: 0 = DDP; 1 = the distributed optimizer (optimizer state sharded);
# 2 = Megatron-FSDP sharding optimizer state and gradients (data_parallel_sharding_strategy is read only by
# Megatron-FSDP, so stage 2 must turn it on; without it "optim_grads" would silently be stage 1).
ZERO_STAGES = {
    0: dict(use_distributed_optimizer=False, data_parallel_sharding_strategy="no_shard", use_megatron_fsdp=False),
    1: dict(use_distributed_optimizer=True, data_parallel_sharding_strategy="optim", use_megatron_fsdp=False),
    2: dict(use_distributed_optimizer=True, data_parallel_sharding_strategy="optim_grads", use_megatron_fsdp=True),
}
AUTO = "auto"  # a knob decided on the final config (resolve_step_fusion)
# The model fields kaiyuan.cuda_graph and kaiyuan.wgrad_fusion set, with their off values. They decide how a
# training step runs (a captured graph, the fused weight-gradient GEMM), not the model's weights or maths; a
# checkpoint's run_config.yaml records them, and a model rebuilt outside training (export, serving,
# evaluation) takes these values instead: it has neither training's kernels nor its step.
TRAINING_STEP_MODEL_FIELDS: dict[str, Any] = {"cuda_graph_impl": "none", "use_te_rng_tracker": False,
                                             "gradient_accumulation_fusion": False}
DATA_SOURCES = ("sample", "mock", "blend", "curriculum", "plan")


@dataclass
class RunSettings:
    """The `kaiyuan.*` knobs, resolved."""

    recipe: str
    run_name: str
    run_dir: Path
    zero_stage: int
    layer_spec: str
    data: str
    tokenizer: str | None
    max_positions: int | None = None
    curriculum: str | None = None
    phase: int | None = None
    heldout: str | None = None
    plan: str | None = None
    tokenizer_sha256: str | None = None
    deterministic: bool = False
    chunked_loss: bool = True
    sdpa_backend: str = "auto"
    compiled_norm: bool = True
    fused_adamw: bool = True
    cuda_graph: bool | str = AUTO  # resolved to a bool by build_config (resolve_step_fusion)
    wgrad_fusion: bool | str = AUTO
    graph_off_reason: str | None = None  # why `auto` left the graph off (the dry-run summary shows it)

    @property
    def uses_fused_adamw(self) -> bool:
        """The fast path's fused optimizer step (training/fused_adamw.py); not bit-for-bit the foreach step."""
        return self.layer_spec == "fast" and self.fused_adamw and not self.deterministic

    @property
    def uses_chunked_loss(self) -> bool:
        """The fast path's chunked linear + cross-entropy (models/chunked_loss.py; installed where TP is 1)."""
        return self.layer_spec == "fast" and self.chunked_loss

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def tensorboard_dir(self) -> Path:
        return self.run_dir / "tb_logs"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def state_dir(self) -> Path:
        return self.run_dir / "run_state"


def _section_types() -> dict[str, type]:
    from megatron.bridge.training.config import (
        CheckpointConfig,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        GPTDatasetConfig,
        LoggerConfig,
        OptimizerConfig,
        ProfilingConfig,
        RNGConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
        ValidationConfig,
    )

    return {
        "train": TrainingConfig,
        "validation": ValidationConfig,
        "optimizer": OptimizerConfig,
        "scheduler": SchedulerConfig,
        "checkpoint": CheckpointConfig,
        "logger": LoggerConfig,
        "rng": RNGConfig,
        "dataset": GPTDatasetConfig,
        "ddp": DistributedDataParallelConfig,
        "tokenizer": TokenizerConfig,
        "profiling": ProfilingConfig,
        "dist": DistributedInitConfig,
    }


def _build_section(name: str, cls: type, values: dict[str, Any], recipe: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)} | {"seq_length"}
    for key in values:
        if key not in known:
            match = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; closest valid field: {name}.{match[0]}" if match else ""
            raise ov.OverrideError(f"recipe {recipe!r}: unknown field {name}.{key}{hint}")
    return cls(**values)


def resolve_run_settings(recipe: str, knobs: dict[str, Any]) -> RunSettings:
    stage = knobs.get("zero_stage", 1)
    if stage not in ZERO_STAGES:
        raise ValueError(f"kaiyuan.zero_stage: expected 0, 1 or 2, got {stage!r}")
    if knobs.get("data", "sample") not in DATA_SOURCES:
        raise ValueError(f"kaiyuan.data: expected one of {DATA_SOURCES}, got {knobs.get('data')!r}")
    if knobs.get("sdpa_backend", "auto") not in SDPA_BACKENDS:
        raise ValueError(f"kaiyuan.sdpa_backend: expected one of {SDPA_BACKENDS}, got {knobs.get('sdpa_backend')!r}")
    run_name = knobs.get("run_name") or recipe
    if "/" in run_name or run_name in {".", ".."}:
        raise ValueError(f"kaiyuan.run_name: {run_name!r} must be a plain directory name")
    deterministic = bool(knobs.get("deterministic", False))
    layer_spec = resolve_layer_spec(knobs.get("layer_spec", "auto"), deterministic)
    for knob in ("cuda_graph", "wgrad_fusion"):
        if knobs.get(knob, AUTO) not in (True, False, AUTO):
            raise ValueError(f"kaiyuan.{knob}: expected true, false or auto, got {knobs[knob]!r}")
    if knobs.get("wgrad_fusion") is True and (layer_spec != "fast" or stage > 1):
        raise ValueError("kaiyuan.wgrad_fusion needs kaiyuan.layer_spec=fast (a CUDA kernel) and kaiyuan.zero_stage "
                         f"0 or 1 (Megatron-FSDP's path needs TE); got layer_spec={layer_spec}, zero_stage={stage}")
    return RunSettings(
        recipe=recipe,
        run_name=run_name,
        run_dir=Path(knobs.get("run_root", "./runs")).expanduser().resolve() / run_name,
        zero_stage=stage,
        layer_spec=layer_spec,
        data=knobs.get("data", "sample"),
        tokenizer=knobs.get("tokenizer"),
        curriculum=knobs.get("curriculum"),
        phase=knobs.get("phase"),
        heldout=knobs.get("heldout"),
        plan=knobs.get("plan"),
        tokenizer_sha256=knobs.get("tokenizer_sha256"),
        deterministic=deterministic,
        chunked_loss=bool(knobs.get("chunked_loss", True)),
        sdpa_backend=knobs.get("sdpa_backend", "auto"),
        compiled_norm=bool(knobs.get("compiled_norm", True)),
        fused_adamw=bool(knobs.get("fused_adamw", True)),
        cuda_graph=knobs.get("cuda_graph", AUTO),
        wgrad_fusion=knobs.get("wgrad_fusion", AUTO),
    )


def _apply_zero_stage(cfg: Any, stage: int) -> None:
    for key, value in ZERO_STAGES[stage].items():
        setattr(cfg.ddp, key, value)
    cfg.optimizer.use_distributed_optimizer = ZERO_STAGES[stage]["use_distributed_optimizer"]
    cfg.dist.use_megatron_fsdp = ZERO_STAGES[stage]["use_megatron_fsdp"]
    if cfg.dist.use_megatron_fsdp:
        cfg.checkpoint.ckpt_format = "fsdp_dtensor"  # the only format Megatron-FSDP saves
    if stage == 0:
        cfg.ddp.overlap_param_gather = False  # only exists with the distributed optimizer


def _megatron_fsdp_grads_as_declared(cfg: Any) -> None:
    """Megatron-FSDP (ZeRO 2) does not read ddp.grad_reduce_in_fp32: its main gradients default to the compute
    dtype (bf16), so micro-batch gradients would be accumulated and reduced in bf16 where ZeRO 0 / 1 use fp32.
    The recipe's setting holds for every stage unless megatron_fsdp_main_grads_dtype is set explicitly."""
    if cfg.ddp.use_megatron_fsdp and cfg.ddp.megatron_fsdp_main_grads_dtype is None and cfg.ddp.grad_reduce_in_fp32:
        import torch

        cfg.ddp.megatron_fsdp_main_grads_dtype = torch.float32


def graph_ineligible_reason(cfg: Any, run: RunSettings) -> str | None:
    """Why `auto` leaves the whole-step CUDA graph off for this run, or None. Auto turns it on only where it was
    measured: the fast spec, ZeRO 0/1, a dense model, no tensor or pipeline parallelism."""
    m = cfg.model
    if run.layer_spec != "fast":
        return f"layer_spec={run.layer_spec}"
    if run.zero_stage > 1:
        return "ZeRO 2 (Megatron-FSDP)"
    if getattr(m, "num_moe_experts", None):
        return "MoE (per-batch expert shapes)"
    if m.tensor_model_parallel_size != 1 or m.pipeline_model_parallel_size != 1:
        return "tensor or pipeline parallel"
    return None


def resolve_step_fusion(cfg: Any, run: RunSettings) -> None:
    """kaiyuan.cuda_graph / kaiyuan.wgrad_fusion = auto (the default): both on where graph_ineligible_reason finds
    nothing. They go together: the fused weight-gradient GEMMs pay off only in a replayed graph (qwen3_1p7b on
    one H200: eager 38,851 -> eager + fusion 36,664 -> graph 40,416 -> graph + fusion 41,358 tokens/s,
    benchmarks/results/2026-11-30_train_throughput_step_fusion.json)."""
    reason = graph_ineligible_reason(cfg, run)
    if run.cuda_graph == AUTO:
        run.cuda_graph, run.graph_off_reason = reason is None, reason
    if run.wgrad_fusion == AUTO:  # (the check installs the addmm path into megatron-core: only when wanted)
        run.wgrad_fusion = bool(run.cuda_graph) and reason is None and compat.torch_wgrad_accumulation()


def _apply_full_step_cuda_graph(cfg: Any) -> None:
    """kaiyuan.cuda_graph: each step's forward and backward captured once (megatron-core's full-iteration graph,
    after model.cuda_graph_warmup_steps eager steps) and replayed. It needs a graph-safe RNG tracker (without TE
    megatron-core's own, asked for through use_te_rng_tracker) and Megatron's per-micro-batch NaN check off
    (Bridge requires it: the check reads the loss on the host); training/loss_guard.py checks once a step.
    The distributed optimizer's parameter all-gather runs in its step instead of overlapping the next forward:
    that overlap waits for the gather in forward pre-hooks, Python that a replayed graph skips."""
    cfg.model.cuda_graph_impl = "full_iteration"
    cfg.model.use_te_rng_tracker = cfg.rng.te_rng_tracker = True
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    cfg.ddp.overlap_param_gather = cfg.optimizer.overlap_param_gather = False
    compat.separate_full_graph_pools(cfg.model)  # else the run fails in its final evaluation


def _apply_wgrad_fusion(cfg: Any) -> None:
    """kaiyuan.wgrad_fusion (checked against the layer spec and ZeRO stage in resolve_run_settings): linear layers
    accumulate their weight gradient straight into the fp32 main grad (megatron-core's
    gradient_accumulation_fusion, through torch's addmm without Apex: compat)."""
    if not compat.torch_wgrad_accumulation():
        raise ValueError("kaiyuan.wgrad_fusion needs torch.addmm(..., out_dtype=) (torch 2.8+) or Apex")
    cfg.model.gradient_accumulation_fusion = True


# What deterministic training needs in the environment before CUDA / NCCL start (Megatron-Bridge checks
# NCCL_ALGO; cuBLAS needs a fixed workspace under torch.use_deterministic_algorithms).
DETERMINISTIC_ENV = {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def deterministic_env(cfg: Any) -> dict[str, str]:
    """The variables to set (where not already set) for `cfg`'s run."""
    if not getattr(cfg.model, "deterministic_mode", False):
        return {}
    return {k: v for k, v in DETERMINISTIC_ENV.items() if k not in os.environ}


def _apply_run_layout(cfg: Any, run: RunSettings) -> None:
    cfg.checkpoint.save = str(run.checkpoint_dir)
    cfg.checkpoint.load = str(run.checkpoint_dir)  # restart = resume, as the original scripts did
    cfg.logger.tensorboard_dir = str(run.tensorboard_dir)
    # Megatron's shuffle-index cache defaults to a folder beside the data: shared by every run reading it,
    # written without a lock, and impossible on read-only storage. Per run, unless the recipe says otherwise.
    if getattr(cfg.dataset, "path_to_cache", None) is None:
        cfg.dataset.path_to_cache = str(run.run_dir / "dataset_cache")


def _tokenizer_config(run: RunSettings) -> Any:
    from megatron.bridge.training.config import TokenizerConfig

    if run.tokenizer:
        from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir

        check_tokenizer_dir(Path(run.tokenizer), run.tokenizer_sha256)  # the sha256 is checked when given
        return TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=run.tokenizer)
    return TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=QWEN2_BASE_VOCAB)


def _apply_data_source(cfg: Any, run: RunSettings) -> None:
    if run.data == "sample":
        from megatron.bridge.training.config import TokenizerConfig

        from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
        from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

        tokenizer_dir = str(run.tokenizer or default_tokenizer_dir())
        cfg.tokenizer = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tokenizer_dir)
        cfg.dataset.blend = prepare_sample_corpus(tokenizer_dir)
        cfg.dataset.blend_per_split = None
    elif run.data == "curriculum":
        from kaiyuan_recipes.data.phase_module import PhaseBlendDataModule

        if not run.curriculum or not run.phase:
            raise ValueError("kaiyuan.data=curriculum needs kaiyuan.curriculum (a name or YAML) and kaiyuan.phase")
        PhaseBlendDataModule(
            curriculum=run.curriculum, phase=int(run.phase), seq_length=cfg.dataset.seq_length,
            global_batch_size=cfg.train.global_batch_size, heldout_prefix=run.heldout, seed=cfg.dataset.random_seed,
        ).apply(cfg)
    elif run.data == "plan":
        from kaiyuan_recipes.data.blend import load_plan, plan_categories, plan_path, to_megatron_blend

        if not run.plan:
            raise ValueError("kaiyuan.data=plan needs kaiyuan.plan (a name under recipes/plans or a YAML)")
        manifest = plan_categories(*load_plan(plan_path(run.plan)))
        for key, value in to_megatron_blend(manifest["blend"], run.heldout).items():
            setattr(cfg.dataset, key, value)
        cfg.dataset.random_seed = manifest["seed"]
    elif run.data == "mock":
        cfg.dataset.blend = None
        cfg.dataset.blend_per_split = None
    elif not (cfg.dataset.blend or cfg.dataset.blend_per_split or cfg.dataset.data_path):
        raise ValueError("kaiyuan.data=blend needs dataset.blend, dataset.blend_per_split or dataset.data_path")


def build_config(recipe: str, overrides: list[str] | None = None) -> tuple[Any, RunSettings]:
    """The complete ConfigContainer for `recipe`, and the resolved run settings."""
    compat.import_megatron_bridge()
    from megatron.bridge.training.config import ConfigContainer, DistributedDataParallelConfig

    overrides = list(overrides or [])
    knob_overrides = [o for o in overrides if ov.is_tree_override(o)]
    container_overrides = [o for o in overrides if o not in knob_overrides]

    tree = load_recipe_tree(recipe)
    ov.apply_to_tree(tree, knob_overrides)
    data = OmegaConf.to_container(tree, resolve=True)
    run = resolve_run_settings(recipe, data.pop("kaiyuan", {}))
    from kaiyuan_recipes.training.profiling import profiling_config

    profiling = profiling_config(data.pop("profile", {}))

    model_shape = data.pop("model")
    mixed_precision = data.pop("mixed_precision", "bf16_mixed")
    types = _section_types()
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise ov.OverrideError(f"recipe {recipe!r}: unknown section(s) {unknown}; known: {sorted(types)}")
    sections = {name: _build_section(name, types[name], data.get(name, {}), recipe) for name in types if name in data}
    sections.setdefault("ddp", DistributedDataParallelConfig())
    sections.setdefault("tokenizer", _tokenizer_config(run))
    if profiling is not None:
        sections["profiling"] = profiling
    # The model reads seq_length from the data part: one value, stated once. RoPE models have no
    # position table, so max_position_embeddings is ours (validation, HF export), not the provider's.
    model_shape.setdefault("seq_length", sections["dataset"].seq_length)
    run.max_positions = model_shape.pop("max_position_embeddings", None)

    cfg = ConfigContainer(
        model=build_provider(model_shape, run.layer_spec), mixed_precision=mixed_precision, **sections
    )
    _apply_zero_stage(cfg, run.zero_stage)
    if run.layer_spec == "fast":
        from kaiyuan_recipes.models.compiled_norm import set_compiled_norm
        from kaiyuan_recipes.models.fast_spec import set_sdpa_backend

        set_sdpa_backend(run.sdpa_backend)
        set_compiled_norm(run.compiled_norm)
    if run.uses_chunked_loss:
        from kaiyuan_recipes.models.chunked_loss import install_chunked_loss

        cfg.model.register_pre_wrap_hook(install_chunked_loss)
    if run.deterministic:
        cfg.model.deterministic_mode = True
        cfg.model.cross_entropy_loss_fusion = False  # upstream: not deterministic
    _apply_run_layout(cfg, run)
    _apply_data_source(cfg, run)
    ov.apply_to_container(cfg, container_overrides)
    resolve_step_fusion(cfg, run)  # on the final model shape (an override may add TP or experts)
    if run.cuda_graph:
        _apply_full_step_cuda_graph(cfg)
    if run.wgrad_fusion:
        _apply_wgrad_fusion(cfg)
    _megatron_fsdp_grads_as_declared(cfg)
    return cfg, run
