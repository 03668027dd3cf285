"""The dry-run summary: what a run will do, resolved from the complete ConfigContainer."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from kaiyuan_recipes.models.param_count import count_parameters
from kaiyuan_recipes.training.config import RunSettings


def summarize(cfg: Any, run: RunSettings, layout: dict[str, int], launch_argv: list[str]) -> dict[str, Any]:
    from kaiyuan_recipes.training.profiling import PROFILE_DIR, profiled_iterations

    shape = {f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)}
    params = count_parameters(shape)
    tokens_per_step = cfg.train.global_batch_size * cfg.dataset.seq_length
    sched = cfg.scheduler
    return {
        "recipe": run.recipe,
        "run_dir": str(run.run_dir),
        "model": {
            "parameters": params.total,
            "non_embedding_parameters": params.non_embedding,
            "layers": cfg.model.num_layers,
            "hidden": cfg.model.hidden_size,
            "heads/groups": f"{cfg.model.num_attention_heads}/{cfg.model.num_query_groups}",
            "deterministic": bool(getattr(cfg.model, "deterministic_mode", False)),
            "layer_spec": getattr(cfg.model.transformer_layer_spec, "__name__", str(cfg.model.transformer_layer_spec)),
            "transformer_impl": cfg.model.transformer_impl,
            "cuda_graph_impl": cfg.model.cuda_graph_impl,
            "gradient_accumulation_fusion": bool(cfg.model.gradient_accumulation_fusion),
        },
        "decided": decided_where(run),
        "fast_path": run.fastpath.summary(),
        "batch": {
            "global_batch_size": cfg.train.global_batch_size,
            "micro_batch_size": cfg.train.micro_batch_size,
            "seq_length": cfg.dataset.seq_length,
            "tokens_per_step": tokens_per_step,
            "train_iters": cfg.train.train_iters,
            "total_tokens": tokens_per_step * cfg.train.train_iters,
        },
        "parallel": {**layout, "zero_stage": run.zero_stage, "ddp_sharding": cfg.ddp.data_parallel_sharding_strategy},
        "schedule": {
            "style": sched.lr_decay_style,
            "lr": cfg.optimizer.lr,
            "min_lr": cfg.optimizer.min_lr,
            "warmup_iters": sched.lr_warmup_iters,
            "decay_tail_iters": sched.lr_wsd_decay_iters,
        },
        "checkpoint": {
            "dir": cfg.checkpoint.save,
            "save_interval": cfg.checkpoint.save_interval,
            "keep_most_recent": cfg.checkpoint.most_recent_k,
            "format": cfg.checkpoint.ckpt_format,
            "resume_from": cfg.checkpoint.load,
            "sigterm_saves": cfg.train.exit_signal_handler,
        },
        "evaluation": {
            "interval": cfg.validation.eval_interval,
            "iters": cfg.validation.eval_iters,
            "data": "mock" if run.data == "mock" else f"validation split ({cfg.dataset.split}) of the blend",
        },
        "data": {
            "source": run.data,
            "tokenizer": (cfg.tokenizer.tokenizer_model or f"NullTokenizer({cfg.tokenizer.vocab_size})")
            + (f" ({run.tokenizer_source})" if run.tokenizer_source else ""),
            "prefixes": _prefixes_shown(cfg.dataset.blend),
            **_data_check(run),
            "order": getattr(cfg.dataset, "order", "shuffled"),  # an ordered phase: data/ordered_dataset.py
            "plan": data_description(cfg, run),
        },
        "tensorboard": cfg.logger.tensorboard_dir,
        "profiling": ("iterations {}..{}".format(*profiled_iterations(cfg.profiling))
                      + f" on ranks {cfg.profiling.profile_ranks} -> {run.run_dir / PROFILE_DIR}"
                      if cfg.profiling is not None and cfg.profiling.use_pytorch_profiler else "off"),
        "launch_command": shlex.join(launch_argv),
    }


def _prefixes_shown(blend: Any, shown: int = 4) -> Any:
    if not blend:
        return None
    prefixes = list(blend[0])
    return prefixes if len(prefixes) <= shown else prefixes[:shown] + [f"... {len(prefixes) - shown} more"]


def _data_check(run: RunSettings) -> dict[str, Any]:
    """What data/preflight.py found: tokens per split, epochs, its warnings (its errors were refused)."""
    check = run.data_check
    if check is None:
        return {}
    shown: dict[str, Any] = {}
    if check.tokens:
        shown["tokens"] = ", ".join(f"{split} {tokens:,}" for split, tokens in check.tokens.items())
    if check.epochs is not None and run.data != "sample":
        shown["epochs"] = round(check.epochs, 2) if check.epochs < 100 else round(check.epochs)
    if check.warnings or check.not_visible:
        shown["check"] = "\n  ".join(check.lines())
    else:
        shown["check"] = "ok (prefixes, weights, splits, tokenizer)"
    return shown


def decided_where(run: RunSettings) -> dict[str, str]:
    """Where the host-dependent `auto`s (layer spec, fast path) are decided, and what the layer spec became."""
    import socket

    from kaiyuan_recipes.training.plan import layer_spec_reason

    return {"on": f"this host ({socket.gethostname()}); rank 0 writes the run's plan at the launch: {run.layout.plan}",
            "layer_spec": f"{run.layer_spec} ({layer_spec_reason(run)})"}


def data_description(cfg: Any, run: RunSettings) -> str:
    """What the run reads, in one line (the sample corpus's window included: data/sample_window.py)."""
    if run.data == "sample":
        from kaiyuan_recipes.data.sample_window import describe_window

        return describe_window(cfg) or "bundled sample corpus"
    if run.data == "mock":
        return "mock: Megatron's synthetic tokens"
    if run.data_dirs is not None:
        return f"{', '.join(run.data_dirs)}: {len(cfg.dataset.blend[0]) if cfg.dataset.blend else '?'} shard(s), " + (
            "weighed by kaiyuan.data_weights" if run.data_weights else "weighed by tokens")
    order = getattr(cfg.dataset, "order", "shuffled")
    prefixes = len(cfg.dataset.blend[0]) if cfg.dataset.blend else None
    where = f"{prefixes} prefix(es)" if prefixes else "blend_per_split"
    phase = f" phase {run.phase} of {run.curriculum}," if run.data == "curriculum" else ""
    return f"{run.data}:{phase} {where}, order {order} (Megatron's sample order for shuffled data)"


def decided_lines(cfg: Any, run: RunSettings) -> list[str]:
    """What was decided for this run, for the console once before training: recipe, model and layer spec, data,
    batch and length, parallelism, and the fast path's plan."""
    shape = {f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)}
    params = count_parameters(shape)
    tokens_per_step = cfg.train.global_batch_size * cfg.dataset.seq_length
    spec = getattr(cfg.model.transformer_layer_spec, "__name__", str(cfg.model.transformer_layer_spec))
    on = [name for name, piece in run.fastpath.pieces.items() if piece.on] if run.fastpath else []
    off = [name for name, piece in run.fastpath.pieces.items() if not piece.on] if run.fastpath else []
    return [
        f"recipe {run.recipe} -> {run.run_dir}",
        f"model {params.total / 1e9:.3f}B parameters ({params.non_embedding / 1e9:.3f}B non-embedding), "
        f"layer spec {run.layer_spec} ({spec}, transformer_impl {cfg.model.transformer_impl})",
        f"data {data_description(cfg, run)}",
        f"batch {cfg.train.global_batch_size} x {cfg.dataset.seq_length} = {tokens_per_step:,} tokens/step, "
        f"{cfg.train.train_iters:,} steps ({tokens_per_step * cfg.train.train_iters / 1e9:,.1f}B tokens), "
        f"ZeRO {run.zero_stage}, checkpoint every {cfg.checkpoint.save_interval} to {cfg.checkpoint.save}",
        "fast path on: " + (", ".join(on) or "none") + ("; off: " + ", ".join(off) if off else "")
        + " (why: kaiyuan train --dry-run)",
        "per log interval: a `kaiyuan: iteration` line; every upstream log record is in logs/upstream.rank<R>.log "
        "(KAIYUAN_VERBOSE=1 or --verbose shows them here)",
    ]


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kaiyuan train {summary['recipe']} — dry run", show_header=False)
    table.add_column("section", style="bold")
    table.add_column("value")
    for section, value in summary.items():
        if isinstance(value, dict):
            text = "\n".join(f"{k}: {_fmt(v)}" for k, v in value.items())
        else:
            text = _fmt(value)
        table.add_row(section, text)
    # markup off: paths, blends and overrides are the user's text, and `[/data/x]` would read as a closing tag
    Console(width=140, markup=False).print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)
