"""Per-step training metrics as JSON lines in <run>/run_state/metrics.jsonl — the machine-readable
record that `kaiyuan status`, benchmarks and plots read (the console log is for people).

A Megatron-Bridge Callback: it only observes; it never changes training."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kaiyuan_recipes.compat.bridge_api import Callback
from kaiyuan_recipes.config.run_layout import METRICS_FILE, dumps_record

# What picks a run's kernels, recorded at train start so that a benchmark row says what it trained: the model's
# fields, and kaiyuan's fast-path pieces (chunked loss, compiled norm, ...), which act outside the model config.
KERNEL_FIELDS = ("transformer_impl", "attention_backend", "apply_rope_fusion", "bias_activation_fusion",
                 "bias_dropout_fusion", "masked_softmax_fusion", "cross_entropy_loss_fusion",
                 "cross_entropy_fusion_impl", "gradient_accumulation_fusion", "cuda_graph_impl")


def kernel_settings(model_cfg: Any, fast_path: Any = None) -> dict[str, Any]:
    """`fast_path`: the run's FastPathPlan (fastpath/decisions.py), or None."""
    def plain(value: Any) -> Any:
        return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)

    settings = {k: plain(getattr(model_cfg, k)) for k in KERNEL_FIELDS if hasattr(model_cfg, k)}
    if fast_path is not None:
        settings["fast_path"] = {name: piece.on for name, piece in fast_path.pieces.items()}
        settings["sdpa_backend"] = fast_path.sdpa_backend
    return settings


class RunMetricsCallback(Callback):
    def __init__(self, state_dir: Path, seq_length: int, fast_path: Any = None):
        self.path = Path(state_dir) / METRICS_FILE
        self.seq_length = seq_length
        self.fast_path = fast_path
        self._t0 = 0.0
        self._last_end: float | None = None  # the previous step's end, unless an evaluation or a save followed it
        self._last_flops: float | None = None

    def _is_writer(self) -> bool:
        import torch.distributed as dist

        return not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1

    def _write(self, record: dict[str, Any]) -> None:
        if self._is_writer():
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(dumps_record(record) + "\n")  # a NaN loss as "nan": strict JSON

    def on_train_start(self, context: Any) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        ts = context.state.train_state
        self._write({"event": "train_start", "iteration": ts.step, "time": time.time(),
                     "model": kernel_settings(context.state.cfg.model, self.fast_path)})

    def on_train_step_start(self, context: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        import torch
        import torch.distributed as dist

        now = time.perf_counter()
        # A step's wall time runs from the previous step's end, so Megatron's logging and the next step's setup
        # (which a whole-step CUDA graph leaves the GPU idle for) count, as in a plain loop timed end to end; the
        # first step, and one after an evaluation or a checkpoint save, runs from its own start.
        elapsed = now - (self._last_end if self._last_end is not None else self._t0)
        ts = context.state.train_state
        cfg = context.state.cfg
        world = dist.get_world_size() if dist.is_initialized() else 1
        loss = None
        if context.loss_dict:
            value = context.loss_dict.get("lm loss", next(iter(context.loss_dict.values())))
            loss = float(value.item() if hasattr(value, "item") else value)
        tokens = cfg.train.global_batch_size * self.seq_length
        # Megatron adds a step's FLOPs to the running total after this hook: the previous step's FLOPs over
        # the same window, one step later.
        tflops = None
        if self._last_flops is not None and ts.floating_point_operations_so_far > self._last_flops:
            tflops = (ts.floating_point_operations_so_far - self._last_flops) / elapsed / world / 1e12
        self._last_end, self._last_flops = now, ts.floating_point_operations_so_far
        self._write(
            {
                "event": "step",
                # train_state.step is incremented after this hook: +1 gives the iteration number
                # that Megatron's log and the checkpoint names use.
                "iteration": ts.step + 1,
                "consumed_samples": ts.consumed_train_samples,
                "loss": loss,
                "lr": context.optimizer.param_groups[0]["lr"] if context.optimizer is not None else None,
                "grad_norm": context.grad_norm,
                "step_time_s": elapsed,
                "tokens_per_s_per_gpu": tokens / elapsed / world,
                "model_tflops_per_gpu": tflops,
                "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
                "skipped": bool(context.skipped_iter),
                "time": time.time(),
            }
        )

    def on_eval_start(self, context: Any) -> None:
        self._last_end = None

    def on_checkpoint_save(self, context: Any) -> None:
        self._last_end = None
        self._write({"event": "checkpoint", "iteration": context.state.train_state.step, "time": time.time()})

    def on_train_end(self, context: Any) -> None:
        self._write({"event": "train_end", "iteration": context.state.train_state.step, "time": time.time()})
