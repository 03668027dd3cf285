"""What every Megatron row of train_throughput.py trains with: the micro-batch settings per model and the row's
overrides of the recipe. token_stream.py writes the stream those settings read and row_settings.py builds their
configs, so both take them from here rather than from train_throughput.py (which runs them)."""

from __future__ import annotations

from pathlib import Path

# The baseline settings of ../shared/gpu-host/README.md: micro batch and micro batches per step.
BATCH = {"qwen3_1p7b": (2, 4), "gpt_smoke": (4, 4)}


def megatron_overrides(layer_spec: str, mbs: int, micro: int, seq: int, steps: int, root: Path, nproc: int = 1,
                       extra: tuple[str, ...] = ()) -> list[str]:
    """The row's overrides of the recipe (benchmarks/row_settings.py builds its config from the same list)."""
    return [f"kaiyuan.layer_spec={layer_spec}", "kaiyuan.data=mock", f"kaiyuan.run_root={root}",
            f"train.train_iters={steps}", f"train.micro_batch_size={mbs}",
            f"train.global_batch_size={mbs * micro * nproc}", f"dataset.seq_length={seq}", "logger.log_interval=1",
            f"checkpoint.save_interval={steps * 10}", "checkpoint.save=null",
            # No evaluation: the final one compiled the fast spec's kernels anew for no-grad mode and outlived
            # the row's time box after every timed step (and failed graphed runs: compat.separate_full_graph_pools).
            "validation.eval_iters=0", *extra]
