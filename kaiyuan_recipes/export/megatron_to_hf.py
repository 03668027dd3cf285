"""Megatron torch_dist checkpoint → Hugging Face directory (and back), through Megatron-Bridge's
AutoBridge, on the CPU, with no hub access. The output is written to a temporary directory and
renamed when complete: an interrupted export leaves no half-written output."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kaiyuan_recipes import fastpath
from kaiyuan_recipes.atomic import atomic_directory, require_new_output
from kaiyuan_recipes.config import run_layout
from kaiyuan_recipes.config.run_layout import RUN_CONFIG_FILE, is_megatron_checkpoint
from kaiyuan_recipes.data.tokenizer import special_token_ids, tokenizer_vocab_size
from kaiyuan_recipes.export.temporary_dir import temporary_directory
from kaiyuan_recipes.models.shape import SHAPE_FIELDS, ModelShape

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")


def ensure_single_process_group() -> None:
    """AutoBridge's loaders are collectives; a CPU export is one gloo process."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    # An in-process store: no port, so a MASTER_PORT inherited from a training job or a parent cannot collide.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()


def newest_iteration_dir(checkpoint: Path) -> Path:
    """One iter_* directory as given, else the save a resume of the run (or checkpoints folder) loads."""
    checkpoint = Path(checkpoint)
    if run_layout.iteration_of(checkpoint) is not None:
        return checkpoint
    root = run_layout.checkpoint_root(checkpoint)
    newest = run_layout.newest_iteration_dir(root)
    if newest is None:
        raise FileNotFoundError(f"{root}: no iter_* checkpoint directories (expected a run directory, its "
                                "checkpoints/ folder or one iter_* directory)")
    return newest


class VocabularyTooSmall(ValueError):
    """The model has fewer embedding rows than the tokenizer has tokens. `reason` says so; the advice differs by
    command (`export hf` takes --tokenizer; `serve` and `eval` export with the bundled tokenizer)."""

    def __init__(self, reason: str, advice: str):
        super().__init__(f"{reason}; {advice}")
        self.reason = reason


def run_config(checkpoint: Path) -> tuple[Path, dict[str, Any] | None]:
    """The newest checkpoint's run_config.yaml (Megatron-Bridge writes one per save) and its contents (read as
    `kaiyuan ckpt` reads it: each section a mapping, else a CheckpointError naming the file)."""
    from kaiyuan_recipes.ckpt.store import read_run_config

    config_file = newest_iteration_dir(checkpoint) / RUN_CONFIG_FILE
    return config_file, read_run_config(config_file.parent)


def trained_tokenizer_dir(checkpoint: Path) -> Path:
    """The tokenizer a run trained with, as its run_config.yaml records it (a run on converted data trains with the
    tokenizer the data was converted with), when that directory is here; else the bundled one (a NullTokenizer run
    over Qwen2 ids, or a checkpoint moved to another host)."""
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    try:
        _, config = run_config(checkpoint)
    except (OSError, ValueError):
        config = None
    tokenizer = (config or {}).get("tokenizer") or {}
    recorded = tokenizer.get("tokenizer_model") if tokenizer.get("tokenizer_type") == "HuggingFaceTokenizer" else None
    if isinstance(recorded, str) and (Path(recorded) / "tokenizer.json").is_file():
        return Path(recorded)
    return default_tokenizer_dir()


def checkpoint_shape(checkpoint: Path) -> ModelShape:
    """The model shape a Megatron-Bridge checkpoint was trained with (its run_config.yaml)."""
    config_file, config = run_config(checkpoint)
    if config is None:
        raise FileNotFoundError(f"{config_file}: missing; pass --recipe to say which model.yaml the checkpoint has")
    model = config.get("model") or {}
    missing = [k for k in ("num_layers", "hidden_size", "vocab_size") if model.get(k) is None]
    if missing:
        raise ValueError(f"{config_file}: model section lacks {missing}")
    return ModelShape.from_run_config(model)


# The fields a --recipe shape must share with the checkpoint: all but the data's sequence length and the positions
# the HF config states, which no weight depends on.
RECIPE_CHECKED_FIELDS = tuple(f for f in SHAPE_FIELDS if f not in ("seq_length", "max_position_embeddings"))


def shape_differences(expected: ModelShape, recorded: ModelShape) -> list[str]:
    """`name expected (recipe) vs recorded (checkpoint)` for each field where the two differ; a field one of them
    leaves unset reads as GPTModelProvider's default, MoE fields count only for a MoE model."""
    import dataclasses

    fastpath.prepare_megatron_bridge()
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    defaults = {f.name: f.default for f in dataclasses.fields(GPTModelProvider) if f.default is not dataclasses.MISSING}
    moe = bool(expected.get("num_moe_experts") or recorded.get("num_moe_experts"))
    differ = []
    for name in RECIPE_CHECKED_FIELDS:
        if name.startswith("moe_") and not moe:
            continue
        ours, theirs = (shape.get(name, defaults.get(name)) for shape in (expected, recorded))
        if name == "num_moe_experts":
            ours, theirs = ours or None, theirs or None  # 0 and unset both mean dense
        elif ours is None or theirs is None:
            continue  # derived when unset (kv_channels, num_query_groups): the fields it derives from are compared
        if ours != theirs:
            differ.append(f"{name} {ours!r} (recipe) vs {theirs!r} (checkpoint)")
    return differ


def check_recipe_shape(checkpoint: Path, shape: ModelShape | dict[str, Any]) -> None:
    """A recipe's shape given for a checkpoint that records its own must be that shape: the export would write
    the recipe's config.json beside the checkpoint's weights."""
    config_file, config = run_config(checkpoint)
    if config is None:
        return  # nothing recorded: the recipe is the only word on the shape
    differ = shape_differences(ModelShape.of(shape), checkpoint_shape(checkpoint))
    if differ:
        raise ValueError(f"{config_file}: the checkpoint is not the recipe's model: {'; '.join(differ)}. Leave "
                         "--recipe out to export the shape the checkpoint records")


def require_torch_dist(checkpoint: Path) -> None:
    """The export reads torch_dist; say so plainly for a run saved otherwise (kaiyuan.zero_stage=2 saves
    Megatron-FSDP's fsdp_dtensor)."""
    config_file, config = run_config(checkpoint)
    fmt = ((config or {}).get("checkpoint") or {}).get("ckpt_format")
    if fmt not in (None, "torch_dist"):
        raise ValueError(f"{config_file}: checkpoint.ckpt_format is {fmt!r} (kaiyuan.zero_stage=2, Megatron-FSDP); "
                         "the export reads 'torch_dist' only, which Megatron-FSDP cannot save. For an exportable "
                         "checkpoint train with kaiyuan.zero_stage=1 (optimizer state sharded, saved as torch_dist)")


def single_rank_overrides(shape: ModelShape | dict[str, Any]) -> dict[str, Any] | None:
    """Settings for rebuilding a model in one process: MoE token routing with the all-gather dispatcher
    (the all-to-all one creates a CUDA stream when built; with one rank both route identically)."""
    return {"moe_token_dispatcher_type": "allgather"} if shape.get("num_moe_experts") else None


def rebuild_overrides(shape: ModelShape | dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint's recorded model config must change to be rebuilt here, outside training: one rank,
    and the training-step-only fields (kaiyuan.cuda_graph / wgrad_fusion) off."""
    from kaiyuan_recipes.fastpath import TRAINING_STEP_MODEL_FIELDS

    return TRAINING_STEP_MODEL_FIELDS | (single_rank_overrides(shape) or {})


def bridge_for(shape: ModelShape | dict[str, Any], tokenizer_vocab: int | None = None,
               tokenizer_dir: Path | None = None):
    """An AutoBridge for `shape`; with a tokenizer directory, its size and its eos / pad ids (e.g. GLM-5.2's
    for laoyao_moe_2b) go into the HF config."""
    fastpath.prepare_megatron_bridge()
    from megatron.bridge import AutoBridge

    special: dict[str, int | None] = {}
    if tokenizer_dir is not None:
        tokenizer_vocab, special = tokenizer_vocab_size(tokenizer_dir), special_token_ids(Path(tokenizer_dir))
    shape = ModelShape.of(shape)
    # Megatron pads the vocabulary up (make_vocab_size_divisible_by): more rows than tokens is normal, fewer is not
    if tokenizer_vocab is not None and shape["vocab_size"] < tokenizer_vocab:
        where = f" ({tokenizer_dir})" if tokenizer_dir is not None else ""
        raise VocabularyTooSmall(f"the model's vocab_size {shape['vocab_size']} is smaller than the tokenizer's "
                                 f"{tokenizer_vocab} tokens{where}: its ids from {shape['vocab_size']} up would "
                                 "have no embedding row", "give the tokenizer the model was trained with "
                                 "(--tokenizer DIR)")
    return AutoBridge.from_hf_config(shape.hf_config(tokenizer_vocab, **special))


def export_hf(checkpoint: Path, out: Path, shape: ModelShape | dict[str, Any] | None = None,
              tokenizer_dir: Path | None = None, show_progress: bool = True) -> Path:
    """Load the newest torch_dist checkpoint under `checkpoint` and write it as a HF directory.
    `shape` (a recipe's ModelShape) defaults to the one recorded in the checkpoint."""
    out = Path(out)
    require_new_output(out)
    require_torch_dist(checkpoint)
    from kaiyuan_recipes.ckpt.screen import screen_pickles

    ckpt = newest_iteration_dir(checkpoint)
    screen_pickles(ckpt)  # upstream's loader below unpickles without restriction: nothing else may be in it
    if shape is not None:
        check_recipe_shape(checkpoint, shape)
    ensure_single_process_group()
    shape = shape or checkpoint_shape(checkpoint)
    bridge = bridge_for(shape, tokenizer_dir=tokenizer_dir)
    model = bridge.load_megatron_model(str(ckpt), mp_overrides=rebuild_overrides(shape), wrap_with_ddp=False)
    return write_hf_dir(bridge, model, out, tokenizer_dir, show_progress)


def write_hf_dir(
    bridge: Any, model: Any, out: Path, tokenizer_dir: Path | None = None, show_progress: bool = True
) -> Path:
    """Weights (sharded safetensors), config, tokenizer files and generation_config, written to a
    temporary directory that is renamed to `out` only when complete."""
    from transformers import GenerationConfig

    models = model if isinstance(model, list) else [model]
    with atomic_directory(out) as tmp:
        bridge.save_hf_pretrained(models, tmp, show_progress=show_progress)
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        config = json.loads((tmp / "config.json").read_text())  # eos / pad as bridge_for decided them
        GenerationConfig(eos_token_id=config["eos_token_id"], pad_token_id=config.get("pad_token_id"),
                         do_sample=False).save_pretrained(tmp)
    return Path(out)


def check_hf_vocab(hf_dir: Path) -> None:
    """config.json's vocab_size covers its tokenizer (tokenizer.json): a folder exported by hand or by an older
    version may not, and transformers then fails deep in the model's construction."""
    config, tokenizer = Path(hf_dir) / "config.json", Path(hf_dir) / "tokenizer.json"
    try:
        vocab = json.loads(config.read_text()).get("vocab_size")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return  # not ours to judge here: transformers names a malformed config
    if not isinstance(vocab, int) or not tokenizer.is_file():
        return
    tokens = tokenizer_vocab_size(hf_dir)
    if vocab < tokens:
        raise ValueError(f"{config}: vocab_size {vocab} is smaller than its tokenizer's {tokens} tokens "
                         f"({tokenizer}): ids from {vocab} up have no embedding row; export the model again with "
                         "the tokenizer it was trained with (kaiyuan export hf --tokenizer DIR)")


@contextlib.contextmanager
def as_hf_dir(model: Path, tokenizer_dir: Path | None = None) -> Iterator[Path]:
    """A HF directory as is (its vocabulary checked against its tokenizer's); a Megatron run / checkpoint exported
    to a temporary directory first, removed when the block ends, however it ends (temporary_dir.py)."""
    model = Path(model)
    if not is_megatron_checkpoint(model):
        if not (model / "config.json").is_file():
            raise FileNotFoundError(f"{model}: neither a HF model directory (config.json) nor a Megatron checkpoint")
        check_hf_vocab(model)
        yield model
        return
    with temporary_directory("kaiyuan-export-") as tmp:
        print(f"kaiyuan: {model} is a Megatron checkpoint: exporting it to a temporary Hugging Face directory first",
              file=sys.stderr, flush=True)
        try:
            exported = export_hf(model, tmp / (model.name or "model"), None,
                                 tokenizer_dir or trained_tokenizer_dir(model))
        except VocabularyTooSmall as err:  # the run's tokenizer is larger: no other is taken here
            raise ValueError(f"{err.reason}; export the checkpoint with the tokenizer it was trained with first "
                             f"(kaiyuan export hf {shlex.quote(str(model))} OUT --tokenizer DIR), then give OUT "
                             "instead") from None
        yield exported
