"""Assembles a Megatron-Bridge ConfigContainer from a recipe's three files plus overrides.

One function per concern: sections from YAML, ZeRO stage → DDP settings, run layout, data source, and the fast
path's plan (kaiyuan_recipes/fastpath/). Everything a recipe can say is a ConfigContainer field or a `kaiyuan.*`
knob (config/knobs.py) — nothing hidden here."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes import compat, fastpath
from kaiyuan_recipes.config import overrides as ov
from kaiyuan_recipes.config.knobs import Knobs
from kaiyuan_recipes.config.launch_request import (
    LaunchRequest,
    check_launch_request,
    container_keys,
    data_source_kind,
    not_with_this_source,
    record_keys,
)
from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.fastpath.apex_standins import torch_wgrad_accumulation
from kaiyuan_recipes.fastpath.decisions import FastPathPlan
from kaiyuan_recipes.models.providers import resolve_layer_spec
from kaiyuan_recipes.models.shape import ModelShape

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


@dataclass
class RunSettings(Knobs):
    """The `kaiyuan.*` knobs resolved for one run: the layer spec decided (never `auto`), where the run lives, and
    (set by build_config on the final config) the fast path's plan."""

    recipe: str = ""
    run_dir: Path = Path()
    max_positions: int | None = None
    fastpath: FastPathPlan | None = None
    wgrad_fusion_without_apex: str | None = None  # what compat.wgrad_fusion_without_apex did, if anything
    # "this host": decided where build_config ran; "plan": loaded with the run's plan (training/plan.py)
    decided: str = "this host"
    layer_spec_knob: str = "auto"  # kaiyuan.layer_spec as given (layer_spec holds what it was decided to be)
    container_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # field -> value, as applied
    tokenizer_source: str | None = None  # kaiyuan.data=DIR: why the run trains with its tokenizer
    data_check: Any = None  # data/preflight.DataCheck, set by training/validate.py

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)


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


def resolve_run_settings(recipe: str, values: dict[str, Any]) -> RunSettings:
    knobs = Knobs.from_mapping(values)
    run_name = knobs.run_name or recipe
    layer_spec = resolve_layer_spec(knobs.layer_spec, knobs.deterministic)
    return RunSettings(**{**knobs.knob_values(), "layer_spec": layer_spec},
                       layer_spec_knob=knobs.layer_spec, recipe=recipe,
                       run_dir=Path(knobs.run_root).expanduser().resolve() / run_name)


def _apply_zero_stage(cfg: Any, stage: int) -> None:
    for key, value in ZERO_STAGES[stage].items():
        setattr(cfg.ddp, key, value)
    cfg.optimizer.use_distributed_optimizer = ZERO_STAGES[stage]["use_distributed_optimizer"]
    cfg.dist.use_megatron_fsdp = ZERO_STAGES[stage]["use_megatron_fsdp"]
    if cfg.dist.use_megatron_fsdp:
        cfg.checkpoint.ckpt_format = "fsdp_dtensor"  # the only format Megatron-FSDP saves
    if stage == 0:
        cfg.ddp.overlap_param_gather = False  # only exists with the distributed optimizer


def _param_gather_overlap_as_stated(cfg: Any, overridden: set[str]) -> None:
    """The recipe states the parameter all-gather overlap once, as ddp.overlap_param_gather; Bridge wants the
    optimizer's twin equal and otherwise turns both on with a warning at every start (and would override a
    `ddp.overlap_param_gather=false`). An explicit optimizer.overlap_param_gather override is left to Bridge."""
    if "optimizer.overlap_param_gather" not in overridden:
        cfg.optimizer.overlap_param_gather = cfg.ddp.overlap_param_gather


def _wgrad_fusion_as_decided(cfg: Any, run: RunSettings, overridden: set[str]) -> None:
    """Off TE's spec kaiyuan.wgrad_fusion (the fast path's plan) decides gradient_accumulation_fusion: Bridge's
    default only follows whether TE imports. A model.gradient_accumulation_fusion override still wins. Then the
    compat workaround for a TE host without Apex, after the plan (whose stand-in may be installed already);
    Megatron-FSDP keeps only TE's own fusion."""
    if run.layer_spec != "transformer_engine" and "model.gradient_accumulation_fusion" not in overridden:
        cfg.model.gradient_accumulation_fusion = run.fastpath.on("wgrad_fusion")
    run.wgrad_fusion_without_apex = _wgrad_fusion_here(cfg, run)


def _wgrad_fusion_here(cfg: Any, run: RunSettings) -> str | None:
    standin = torch_wgrad_accumulation if run.zero_stage < 2 else None
    return compat.wgrad_fusion_without_apex(cfg.model, standin=standin)


def install_in_this_process(cfg: Any, run: RunSettings) -> None:
    """For a container built in another process (a rank loading the run's plan): what build_config installs in the
    process itself and no serialization carries (the fast path's patches and model hooks, the stand-in for Apex's
    fused weight-gradient GEMM). Each step is idempotent, so the container's values stay as they were built."""
    fastpath.apply(cfg, run.fastpath)
    _wgrad_fusion_here(cfg, run)


def _megatron_fsdp_grads_as_declared(cfg: Any) -> None:
    """Megatron-FSDP (ZeRO 2) does not read ddp.grad_reduce_in_fp32: its main gradients default to the compute
    dtype (bf16), so micro-batch gradients would be accumulated and reduced in bf16 where ZeRO 0 / 1 use fp32.
    The recipe's setting holds for every stage unless megatron_fsdp_main_grads_dtype is set explicitly."""
    if cfg.ddp.use_megatron_fsdp and cfg.ddp.megatron_fsdp_main_grads_dtype is None and cfg.ddp.grad_reduce_in_fp32:
        import torch

        cfg.ddp.megatron_fsdp_main_grads_dtype = torch.float32


# What deterministic training needs in the environment before CUDA / NCCL start (Megatron-Bridge checks
# NCCL_ALGO; cuBLAS needs a fixed workspace under torch.use_deterministic_algorithms; TE's attention backward picks
# only deterministic kernels with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0). Bridge's own
# recipes/utils/determinism_utils.py sets the same three.
DETERMINISTIC_ENV = {"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}


def deterministic_env(cfg: Any) -> dict[str, str]:
    """The variables to set (where not already set) for `cfg`'s run."""
    if not getattr(cfg.model, "deterministic_mode", False):
        return {}
    return {k: v for k, v in DETERMINISTIC_ENV.items() if k not in os.environ}


def _apply_run_layout(cfg: Any, run: RunSettings) -> None:
    cfg.checkpoint.save = str(run.layout.checkpoints)
    cfg.checkpoint.load = str(run.layout.checkpoints)  # restart = resume, as the original scripts did
    cfg.logger.tensorboard_dir = str(run.layout.tensorboard)
    # Megatron's shuffle-index cache defaults to a folder beside the data: shared by every run reading it,
    # written without a lock, and impossible on read-only storage. Per run, unless the recipe says otherwise.
    if getattr(cfg.dataset, "path_to_cache", None) is None:
        cfg.dataset.path_to_cache = str(run.layout.dataset_cache)


def _keep_for_average(cfg: Any, last: int) -> None:
    """kaiyuan.average_last=N: keep-last-K never deletes a checkpoint `kaiyuan average --last N` needs."""
    k = cfg.checkpoint.most_recent_k
    if last > 0 and k is not None and -1 < k < last:
        cfg.checkpoint.most_recent_k = last


def _tokenizer_config(run: RunSettings) -> Any:
    from megatron.bridge.training.config import TokenizerConfig

    if run.tokenizer:
        from kaiyuan_recipes.data.tokenizer import check_tokenizer_dir

        check_tokenizer_dir(Path(run.tokenizer), run.tokenizer_sha256)  # the sha256 is checked when given
        return TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=run.tokenizer)
    return TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=QWEN2_BASE_VOCAB)


def _apply_converted_dirs(cfg: Any, run: RunSettings) -> None:
    """kaiyuan.data=DIR or [DIR1, DIR2]: every shard of the directories, weighed by tokens (or kaiyuan.data_weights),
    trained with the tokenizer their manifest records (kaiyuan.tokenizer, when given, must be that one)."""
    from megatron.bridge.training.config import TokenizerConfig

    from kaiyuan_recipes.data.blend import to_megatron_blend
    from kaiyuan_recipes.data.converted import choose_tokenizer, resolve_data_dirs
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    data = resolve_data_dirs(run.data_dirs, run.data_weights)
    tokenizer_dir, run.tokenizer_source = choose_tokenizer(data, run.tokenizer)
    cfg.tokenizer = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer",
                                    tokenizer_model=str(tokenizer_dir or default_tokenizer_dir()))
    for key, value in to_megatron_blend({"prefixes": data.prefixes, "weights": data.weights}, run.heldout).items():
        setattr(cfg.dataset, key, value)
    cfg.dataset.data_path = None


def _apply_data_source(cfg: Any, run: RunSettings, stated: StatedValues) -> None:
    """The data source's defaults (blend, tokenizer, seed, a curriculum's length and schedule), written under the
    user's overrides, which come after. What a source derives them from (batch, sequence length, evaluation
    cadence) it reads as stated, never from the container, where an override is not applied yet."""
    if run.data_dirs is not None:
        _apply_converted_dirs(cfg, run)
    elif run.data == "sample":
        from megatron.bridge.training.config import TokenizerConfig

        cfg.tokenizer = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer")
        sample_corpus_on_this_node(cfg, run)
        cfg.dataset.blend_per_split = None
        _sample_window(cfg, stated)
    elif run.data == "curriculum":
        from kaiyuan_recipes.data.phase_module import PhaseBlendDataModule

        if not run.curriculum or not run.phase:
            raise ValueError("kaiyuan.data=curriculum needs kaiyuan.curriculum (a name or YAML) and kaiyuan.phase")
        PhaseBlendDataModule(
            curriculum=run.curriculum, phase=int(run.phase), seq_length=stated.count("dataset.seq_length"),
            global_batch_size=stated.count("train.global_batch_size"), heldout_prefix=run.heldout,
            seed=stated("dataset.random_seed"),
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


def sample_corpus_on_this_node(cfg: Any, run: RunSettings) -> None:
    """A run on the bundled corpus reads the tokenizer and the tokenized corpus from this node's cache, prepared here
    when missing (cache_lock: the node's ranks wait for one). Rank 0's plan names its own cache; a node without a
    file system shared with it has another, where the same files carry the same names (the tokenizer's
    fingerprint), so only the paths differ."""
    if run.data != "sample":
        return
    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    tokenizer_dir = str(run.tokenizer or default_tokenizer_dir())
    cfg.tokenizer.tokenizer_model = tokenizer_dir
    cfg.dataset.blend = prepare_sample_corpus(tokenizer_dir)


def _sample_window(cfg: Any, stated: StatedValues) -> None:
    """The bundled corpus is indexed for a bounded window of steps and cycled (data/sample_window.py says why)."""
    from kaiyuan_recipes.data.sample_window import SAMPLE_WINDOW_STEPS, SampleWindowDatasetConfig

    if isinstance(cfg.dataset, SampleWindowDatasetConfig):
        return
    # What Bridge would ask for a run of SAMPLE_WINDOW_STEPS steps (data/loaders.py get_train_valid_test_num_samples)
    batch = stated.count("train.global_batch_size")
    # eval_interval None is Bridge's default: no periodic evaluation (one at the end), as 0
    eval_interval = 0 if stated("validation.eval_interval") is None else stated.count("validation.eval_interval", 0)
    eval_iters = stated.count("validation.eval_iters", 0)
    evaluations = SAMPLE_WINDOW_STEPS // eval_interval + 1 if eval_interval else 1
    cfg.dataset = SampleWindowDatasetConfig.from_config(
        cfg.dataset, train_window_samples=SAMPLE_WINDOW_STEPS * batch,
        eval_window_samples=evaluations * max(eval_iters, 1) * (stated("validation.eval_global_batch_size") or batch),
        corpus_tokens=int(sum(cfg.dataset.blend[1])))


@dataclass(frozen=True)
class StatedValues:
    """A container field as the command line, else the recipe (else the field's default), states it: what a data
    source derives its defaults from before the user's overrides are applied to the container."""

    request: LaunchRequest
    cfg: Any  # the recipe's container, before the data source and the overrides

    def __call__(self, dotted: str) -> Any:
        value = self.request.value(dotted)
        if isinstance(value, str) and "${" in value:  # an interpolation: the number Bridge will resolve it to
            value = ov.value_once_applied(self.cfg, [o for o in self.request.overrides if not ov.is_tree_override(o)],
                                          dotted)
        return ov.get_field(self.cfg, dotted) if value is None else value

    def count(self, dotted: str, least: int = 1) -> int:
        value = self(dotted)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "a positive integer" if least == 1 else f"an integer, {least} or more"
            raise ov.OverrideError(f"{dotted}={value!r}: expected {kind}")
        return value


def build_config(recipe: str, overrides: list[str] | None = None) -> tuple[Any, RunSettings]:
    """The complete ConfigContainer for `recipe`, and the resolved run settings, every `auto` decided for this host.
    Built once per run, by the process that trains (rank 0: training/plan.py); the others load it.

    One order, each layer applied once: the recipe (with its `kaiyuan.*` settings), the data source's defaults, the
    user's overrides, then the fields that follow from the others. Its cross-checks: training/validate.py."""
    overrides = list(overrides or [])
    # what can be refused without Megatron is refused first (a misspelt recipe or knob answers at once)
    request = check_launch_request(recipe, overrides)
    fastpath.prepare_megatron_bridge()
    run = resolve_run_settings(recipe, request.knobs.knob_values())
    cfg = _recipe_container(request, run)
    recipe_keys = container_keys(cfg)
    _apply_data_source(cfg, run, StatedValues(request, cfg))
    # the keys overrides apply to: a data source may swap the dataset section's class for one with other fields
    keys, dataset_class = container_keys(cfg), type(cfg.dataset).__name__
    record_keys(recipe, data_source_kind(request.knobs), keys, recipe_keys, dataset_class)
    container_overrides = [o for o in overrides if not ov.is_tree_override(o)]
    ov.refuse_unknown_keys(container_overrides, keys, recipe_keys - keys,
                           lambda key: not_with_this_source(key, request.knobs, dataset_class))
    run.container_overrides = ov.apply_to_container(cfg, container_overrides)
    _derive(cfg, run)
    return cfg, run


def _recipe_container(request: LaunchRequest, run: RunSettings) -> Any:
    """The recipe's sections as Megatron-Bridge's dataclasses, with what the `kaiyuan.*` knobs set in them (ZeRO
    stage, determinism, where the run lives)."""
    from megatron.bridge.training.config import ConfigContainer, DistributedDataParallelConfig

    from kaiyuan_recipes.training.profiling import profiling_config

    recipe = request.recipe
    data = copy.deepcopy(request.sections)
    profiling = profiling_config(request.profile)
    model_section = data.pop("model")
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
    # The model reads seq_length from the data part: one value, stated once.
    if "seq_length" in model_section:
        raise ov.OverrideError(f"recipe {recipe!r}: model.seq_length is dataset.seq_length's; state it there only")
    shape = ModelShape({**model_section, "seq_length": sections["dataset"].seq_length})
    run.max_positions = shape.max_positions
    cfg = ConfigContainer(model=shape.provider(run.layer_spec), mixed_precision=mixed_precision, **sections)
    _apply_zero_stage(cfg, run.zero_stage)
    if run.deterministic:
        cfg.model.deterministic_mode = True
        cfg.model.cross_entropy_loss_fusion = False  # upstream: not deterministic
    _apply_run_layout(cfg, run)
    return cfg


def _derive(cfg: Any, run: RunSettings) -> None:
    """What follows from the final values (the recipe, the data source and the overrides applied): each field here
    is left as the user set it where an override names it."""
    overridden = set(run.container_overrides)
    if run.data == "blend" and not (cfg.dataset.blend or cfg.dataset.blend_per_split or cfg.dataset.data_path):
        raise ValueError("kaiyuan.data=blend needs dataset.blend, dataset.blend_per_split or dataset.data_path")
    if run.data == "curriculum":
        from kaiyuan_recipes.data.phase_module import adopt_schedule_over

        adopt_schedule_over(cfg, int(run.phase), overridden)
    _param_gather_overlap_as_stated(cfg, overridden)
    _keep_for_average(cfg, run.average_last)
    if "model.seq_length" not in overridden:
        cfg.model.seq_length = cfg.dataset.seq_length  # an override of dataset.seq_length reaches the model
    run.fastpath = fastpath.plan(cfg, run)  # on the final config (an override may add TP or experts)
    fastpath.apply(cfg, run.fastpath)
    _wgrad_fusion_as_decided(cfg, run, overridden)
    _megatron_fsdp_grads_as_declared(cfg)
