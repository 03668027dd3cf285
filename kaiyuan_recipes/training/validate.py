"""Every cross-check of a built config, in one function (validate) that each process building the config calls once:
`kaiyuan train`, `kaiyuan start`, `kaiyuan data index` and each rank. It catches an impossible configuration before
any GPU work, with messages that say which fields disagree and what was expected."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import signal
from pathlib import Path
from typing import Any

from kaiyuan_recipes.config.parallel_layout import LayoutError, parallel_layout_of
from kaiyuan_recipes.data.tokenizer import tokenizer_vocab_size as vocab_size_of_dir
from kaiyuan_recipes.models.param_count import padded_vocab_size


class ConfigError(ValueError):
    pass


def tokenizer_vocab_size(cfg: Any) -> int:
    tok = cfg.tokenizer
    if tok.tokenizer_type == "NullTokenizer":
        return int(tok.vocab_size) + 1  # Megatron's NullTokenizer appends EOD
    path = Path(str(tok.tokenizer_model))
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(f"tokenizer.tokenizer_model: {path}/tokenizer.json not found "
                          "(expected a Hugging Face tokenizer directory)")
    return vocab_size_of_dir(path)


def parallel_layout(cfg: Any, world_size: int) -> dict[str, int]:
    m = cfg.model
    try:
        return parallel_layout_of(m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                                  m.context_parallel_size, cfg.train.micro_batch_size, cfg.train.global_batch_size,
                                  world_size)
    except LayoutError as err:
        raise ConfigError(str(err)) from None


def local_spec_norms_are_torchs() -> bool:
    """Megatron's local spec takes Apex's fused norms when Apex imports, else torch's (WrappedTorchNorm)."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return gpt_layer_specs.LNImpl is WrappedTorchNorm


def check_profile_window(cfg: Any) -> None:
    from kaiyuan_recipes.training.profiling import profiled_iterations

    last = profiled_iterations(cfg.profiling)[1]
    if last >= cfg.train.train_iters:
        raise ConfigError(f"profile.steps ends at iteration {last}: upstream writes the trace when iteration "
                          f"{last + 1} begins, so train.train_iters={cfg.train.train_iters} must be at least "
                          f"{last + 1}")


def check_blend(field: str, blend: Any) -> None:
    """A Megatron blend, (prefixes, weights or None): one weight per prefix, each a positive finite number.
    Megatron-core normalises weights by their sum, so NaN, infinities, negatives and zeros would pass into the
    sampling plan (NaN everywhere, or a source read never or backwards)."""
    if blend is None:
        return
    if not isinstance(blend, (list, tuple)) or len(blend) != 2 or not isinstance(blend[0], (list, tuple)):
        raise ConfigError(f"{field}: expected [prefixes, weights] (weights may be null), got {blend!r}")
    prefixes, weights = blend
    if weights is None:
        return
    if not isinstance(weights, (list, tuple)) or len(weights) != len(prefixes):
        raise ConfigError(f"{field}: {len(prefixes)} prefixes but weights {weights!r}; give one weight per prefix")
    for i, (prefix, weight) in enumerate(zip(prefixes, weights)):
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0
        if not ok:
            raise ConfigError(f"{field}: weight {weight!r} of entry {i} ({prefix}) is not a positive finite number")


def check_blends(dataset: Any) -> None:
    """dataset.blend, each split of dataset.blend_per_split, and dataset.data_path ("w1 p1 w2 p2", which Bridge
    turns into the blend when the config is finalised, after this check) as megatron-core parses it."""
    check_blend("dataset.blend", getattr(dataset, "blend", None))
    for i, split in enumerate(getattr(dataset, "blend_per_split", None) or []):
        check_blend(f"dataset.blend_per_split[{i}]", split)
    data_path = getattr(dataset, "data_path", None)
    if data_path is not None and getattr(dataset, "blend", None) is None:
        from megatron.core.datasets.utils import get_blend_from_list

        paths = data_path.split() if isinstance(data_path, str) else [str(p) for p in data_path]
        check_blend("dataset.data_path", get_blend_from_list(paths))


def check_counts(cfg: Any, world_size: int) -> None:
    """Sizes, counts and intervals at least 1 (a recipe's values as well as the command line's), the learning
    rates not negative, and at least one rank."""
    from kaiyuan_recipes.config.overrides import NON_NEGATIVE_INTEGERS, POSITIVE_INTEGERS, not_a_count

    for key in POSITIVE_INTEGERS + NON_NEGATIVE_INTEGERS:
        section, name = key.split(".", 1)
        problem = not_a_count(key, getattr(getattr(cfg, section, None), name, None))
        if problem:
            raise ConfigError(problem)
    for name in ("lr", "min_lr"):
        value = getattr(cfg.optimizer, name, None)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"optimizer.{name}={value!r}: expected a finite number, 0 or more")
    if world_size < 1:
        raise ConfigError(f"{world_size} ranks: a run needs at least one (--nproc-per-node, --nodes)")


def run_tokenizer(cfg: Any) -> Any:
    """The run's tokenizer as the data checks compare it (data/preflight.RunTokenizer)."""
    from kaiyuan_recipes.data.preflight import RunTokenizer
    from kaiyuan_recipes.data.tokenizer import sha256_of, tokenizer_identity

    tok = cfg.tokenizer
    if tok.tokenizer_type == "NullTokenizer":  # Megatron's appends EOD after the base vocabulary
        return RunTokenizer(f"NullTokenizer({tok.vocab_size})", int(tok.vocab_size) + 1, int(tok.vocab_size))
    if tok.tokenizer_type != "HuggingFaceTokenizer":
        return None
    path = Path(str(tok.tokenizer_model))
    vocab, eod = tokenizer_identity(path)
    return RunTokenizer(str(path), vocab, eod, sha256_of(path / "tokenizer.json"))


def data_spec(cfg: Any) -> Any:
    """What `cfg` asks of its data, as plain values (data/preflight.DataSpec)."""
    from kaiyuan_recipes.data.preflight import DataSpec, run_samples

    d, t, v = cfg.dataset, cfg.train, cfg.validation
    blend = d.blend
    if blend is None and d.blend_per_split is None and getattr(d, "data_path", None) is not None:
        from megatron.core.datasets.utils import get_blend_from_list

        blend = get_blend_from_list(d.data_path.split() if isinstance(d.data_path, str) else list(d.data_path))
    window = getattr(d, "train_window_samples", None)  # the sample corpus: indexed for a window (sample_window.py)
    samples = ((window, d.eval_window_samples, 0) if window is not None else
               run_samples(t.train_iters, t.global_batch_size, v.eval_interval, v.eval_iters,
                           getattr(v, "eval_global_batch_size", None), getattr(t, "train_samples", None)))
    return DataSpec(blend, d.blend_per_split, d.split, d.seq_length, samples, cfg.model.vocab_size)


def schedule_warnings(cfg: Any) -> list[str]:
    """A run shorter than its recipe's schedule trains, but not as its recipe means: the learning rate still warming
    up at the end, no checkpoint or evaluation before it ends."""
    iters, found = cfg.train.train_iters, []
    if not iters:
        return found
    sched, val, ckpt = cfg.scheduler, cfg.validation, cfg.checkpoint
    warmup = sched.lr_warmup_iters or (sched.lr_warmup_samples or 0) // max(cfg.train.global_batch_size, 1)
    if warmup >= iters:
        found.append(f"scheduler.lr_warmup_iters={warmup} is not shorter than train.train_iters={iters}: the learning "
                     "rate never reaches its peak; set scheduler.lr_warmup_iters to a fraction of the run")
    if ckpt.save and ckpt.save_interval and ckpt.save_interval > iters:
        found.append(f"checkpoint.save_interval={ckpt.save_interval} is longer than the run ({iters} iterations): "
                     "its only checkpoint is the one at its end or at a stop")
    if val.eval_interval and val.eval_iters and val.eval_interval > iters:
        found.append(f"validation.eval_interval={val.eval_interval} is longer than the run ({iters} iterations): no "
                     "validation loss until its end")
    return found


def check_run_data(cfg: Any, run: Any, ranks_here: bool) -> Any:
    """data/preflight.check_data on `cfg`'s data: its errors refused here (ConfigError), the check kept on `run` for
    the dry run and the launch to show its warnings. An ordered curriculum phase blends whole directories (its own
    dataset class reads them): its tokenizer is checked, the rest is left to `kaiyuan data index`."""
    from kaiyuan_recipes.data.preflight import check_data

    spec = data_spec(cfg)
    if getattr(cfg.dataset, "order", "shuffled") != "shuffled":
        spec = dataclasses.replace(spec, blend=None, blend_per_split=None)
    check = check_data(spec, run_tokenizer(cfg), ranks_here=ranks_here)
    if run.data == "sample":
        check.warnings = []  # a pipeline check, cycled on purpose (data/sample_window.py)
    else:
        check.warnings += schedule_warnings(cfg)
    run.data_check = check
    if check.errors:
        raise ConfigError("the data would fail the launch:\n  " + "\n  ".join(check.errors))
    return check


def validate(cfg: Any, run: Any, world_size: int, upstream: bool = True,
             data_here: bool | None = False) -> dict[str, int]:
    """Every cross-check of `cfg` as build_config made it for `run` (its RunSettings), before any GPU work; the
    parallel layout. Ours first (they name the fields), then kaiyuan.heldout_eval's file and layout, then
    (`upstream`) Megatron-Bridge's own validation on a copy, as `pretrain` runs it at start-up; a rank leaves that to
    its `pretrain`. `data_here`: the data checks (data/preflight.py), data
    that is nowhere on this host refused (True: this process or its ranks read it here) or said in one line (False: a
    dry run, a launch host); None skips them (a rank: its own dataset build says it)."""
    check_counts(cfg, world_size)
    m, seq, max_positions = cfg.model, cfg.dataset.seq_length, run.max_positions
    if m.seq_length != seq:
        raise ConfigError(f"model.seq_length={m.seq_length} differs from dataset.seq_length={seq}; set them equal")
    if max_positions is not None and seq > max_positions:
        raise ConfigError(f"dataset.seq_length={seq} is longer than the model's "
                          f"max_position_embeddings={max_positions}")
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % groups:
        raise ConfigError(f"model.num_attention_heads={m.num_attention_heads} is not a multiple of "
                          f"num_query_groups={groups}")
    if groups % m.tensor_model_parallel_size:
        raise ConfigError(f"model.num_query_groups={groups} is not divisible by "
                          f"tensor_model_parallel_size={m.tensor_model_parallel_size}")
    if m.sequence_parallel and m.transformer_impl == "local" and local_spec_norms_are_torchs():
        raise ConfigError("model.sequence_parallel=true needs Transformer Engine or Apex norms: without them the local "
                          "and fast specs use torch's RMSNorm / LayerNorm, which megatron-core refuses under sequence "
                          "parallelism (megatron/core/transformer/torch_norm.py); set model.sequence_parallel=false")
    if m.cuda_graph_impl != "none" and not getattr(m, "use_te_rng_tracker", False):
        # Megatron-Bridge asserts this only when the ranks build the model. Without TE the flag gives
        # megatron-core's own graph-safe tracker (CudaRNGStatesTracker with use_cudagraphable_rng).
        raise ConfigError(f"model.cuda_graph_impl={m.cuda_graph_impl} needs model.use_te_rng_tracker=true (a CUDA-"
                          "graph-safe RNG tracker: TE's, or without TE megatron-core's own); or set "
                          "model.cuda_graph_impl=none")
    if (m.cuda_graph_impl == "full_iteration" and getattr(m, "num_moe_experts", None)
            and not getattr(m, "moe_pad_expert_input_to_capacity", False)):
        # A graph replays fixed shapes and cannot read tensors on the host; the token dispatchers copy the
        # per-expert token counts to the host (megatron/core/transformer/moe/token_dispatcher.py) unless padded.
        raise ConfigError("a whole-step CUDA graph (kaiyuan.cuda_graph / model.cuda_graph_impl=full_iteration) with "
                          f"{m.num_moe_experts} experts needs fixed expert shapes: model.moe_expert_capacity_factor "
                          "and model.moe_pad_expert_input_to_capacity=true; or kaiyuan.cuda_graph=false")
    if cfg.train.exit_signal_handler and cfg.train.exit_signal != signal.SIGTERM:
        raise ConfigError(f"train.exit_signal={signal.Signals(cfg.train.exit_signal).name}: `kaiyuan stop` and "
                          "torchrun send SIGTERM for the checkpoint-and-exit (and `kaiyuan stacks` uses SIGUSR1); "
                          "keep SIGTERM")
    if cfg.profiling is not None and cfg.profiling.use_pytorch_profiler:
        check_profile_window(cfg)
    check_blends(cfg.dataset)
    tok_vocab = tokenizer_vocab_size(cfg)
    if m.vocab_size < tok_vocab:
        raise ConfigError(f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's vocabulary "
                          f"({tok_vocab} ids)")
    tp = m.tensor_model_parallel_size
    if not m.should_pad_vocab and m.vocab_size % tp:
        padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
        raise ConfigError(f"model.vocab_size={m.vocab_size} is not divisible by tensor_model_parallel_size={tp}; "
                          f"use {padded}")
    if data_here is not None:  # the data as the index builder will read it
        check_run_data(cfg, run, ranks_here=data_here)
    if run.heldout_eval is not None:  # a bad file is refused here, before any training (its lines named)
        from kaiyuan_recipes.training.heldout_eval.check import check_heldout_eval

        check_heldout_eval(cfg, run)
    layout = parallel_layout(cfg, world_size)
    if upstream:
        resolve_with_upstream(cfg, world_size)
    return layout


def resolve_with_upstream(cfg: Any, world_size: int) -> Any:
    """Run Megatron-Bridge's own runtime_config_update (mixed precision, DP size, scheduler steps,
    validation) on a copy, as `pretrain` will at start-up, so a dry run fails where a real run would."""
    import torch
    from megatron.bridge.training.config import runtime_config_update

    from kaiyuan_recipes.training.config import deterministic_env

    resolved = copy.deepcopy(cfg)
    env = {"WORLD_SIZE": str(world_size), "RANK": "0", "LOCAL_RANK": "0", **deterministic_env(cfg)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    deterministic = torch.are_deterministic_algorithms_enabled()  # upstream turns it on for deterministic_mode
    try:
        runtime_config_update(resolved)
    except (AssertionError, ValueError) as err:
        raise ConfigError(f"Megatron-Bridge rejected the configuration: {err}") from err
    finally:
        torch.use_deterministic_algorithms(deterministic)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return resolved

