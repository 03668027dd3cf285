"""One console line per log interval: iteration, loss, lr, tokens/s, TFLOP/s, peak memory and ETA
(training/run_logging.py formats it). A Megatron-Bridge Callback: it only observes. The first step of a start or a
resume gets its line too, so a user sees the loss as soon as there is one (a recipe's step can take a minute and its
log interval ten steps); its figures include that step's compilation and warm-up.

Figures are over the interval since the previous line, wall clock included (evaluations and saves in it count),
so the ETA is what the run will really take at this pace. The loss is the interval's mean."""

from __future__ import annotations

import time
from typing import Any

from kaiyuan_recipes.compat.bridge_api import Callback
from kaiyuan_recipes.training.run_logging import progress_line


class ConsoleProgressCallback(Callback):
    def __init__(self, log_interval: int, seq_length: int):
        self.interval = max(int(log_interval or 1), 1)
        self.seq_length = seq_length
        self._since: tuple[float, int, float] | None = None  # (time, iteration, FLOPs so far) at the window start
        self._first_iteration: int | None = None  # the first step of this start or resume
        self._losses: list[float] = []
        self._flops_per_step: float | None = None

    @staticmethod
    def _prints() -> bool:
        """The last rank: it holds the loss (last pipeline stage), as Megatron's own iteration line."""
        import torch.distributed as dist

        return not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1

    def on_train_start(self, context: Any) -> None:
        ts = context.state.train_state
        self._since = (time.perf_counter(), ts.step, float(ts.floating_point_operations_so_far))
        self._first_iteration = ts.step + 1

    def on_train_step_end(self, context: Any) -> None:
        if context.loss_dict:
            value = context.loss_dict.get("lm loss", next(iter(context.loss_dict.values())))
            self._losses.append(float(value.item() if hasattr(value, "item") else value))
        ts = context.state.train_state
        iteration = ts.step + 1  # train_state.step is incremented after this hook
        if self._since is None or (iteration % self.interval and iteration != self._first_iteration):
            return
        now, flops = time.perf_counter(), float(ts.floating_point_operations_so_far)
        start, first, flops_then = self._since
        self._since = (now, iteration, flops)
        losses, self._losses = self._losses, []
        if not self._prints() or iteration <= first:
            return
        print(self.line(context, iteration, now - start, iteration - first, flops - flops_then, losses,
                        first_step=iteration == self._first_iteration), flush=True)

    def _step_flops(self, cfg: Any) -> float:
        """One step's model FLOPs by Megatron-Bridge's own formula (every step has the same shapes). Megatron adds a
        step's count after this hook, so the first line's window holds none of its own."""
        if self._flops_per_step is None:
            try:
                from megatron.bridge.training.utils import flop_utils

                self._flops_per_step = float(flop_utils.num_floating_point_operations(
                    cfg, batch_size=cfg.train.global_batch_size))
            except Exception:  # noqa: BLE001 (a console figure never stops training: the line shows `TFLOP/s -`)
                self._flops_per_step = 0.0
        return self._flops_per_step

    def _first_step_note(self, cfg: Any) -> str:
        """What makes a first step long: every micro-batch of the global batch, compilation and graph capture."""
        micro, data_parallel = getattr(cfg.train, "micro_batch_size", None), getattr(cfg, "data_parallel_size", None)
        if not micro or not data_parallel:
            return ""
        count = cfg.train.global_batch_size // (micro * data_parallel)
        return (f" (first step: {count:,} micro-batches of {micro} x {self.seq_length}, compilation and warm-up "
                "included)")

    def line(self, context: Any, iteration: int, elapsed: float, steps: int, flops: float,
             losses: list[float], first_step: bool = False) -> str:
        import torch
        import torch.distributed as dist

        cfg = context.state.cfg
        world = dist.get_world_size() if dist.is_initialized() else 1
        elapsed = max(elapsed, 1e-9)
        optimizer = context.optimizer
        lr = optimizer.param_groups[0]["lr"] if optimizer is not None and optimizer.param_groups else None
        # Megatron adds a step's FLOPs after this hook: the window's count is shifted by one step, not short; the
        # first window's holds none, so its steps are counted by the formula.
        if flops <= 0:
            flops = steps * self._step_flops(cfg)
        tflops = flops / elapsed / world / 1e12 if flops > 0 else None
        return progress_line(
            iteration=iteration, total=cfg.train.train_iters, loss=sum(losses) / len(losses) if losses else None,
            lr=lr, tokens_per_s=steps * cfg.train.global_batch_size * self.seq_length / elapsed, gpus=world,
            tflops_per_gpu=tflops,
            peak_mem_gb=torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
            seconds_per_step=elapsed / steps, note=self._first_step_note(cfg) if first_step else "")
