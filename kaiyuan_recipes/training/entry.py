"""What each torchrun worker runs: build the recipe's ConfigContainer and call Megatron-Bridge's
pretrain with its GPT forward step. `python -m kaiyuan_recipes.training.entry RECIPE [overrides]`."""

from __future__ import annotations

import os
import sys
from typing import Any

from kaiyuan_recipes import compat, fastpath
from kaiyuan_recipes.launch.stacks import enable_stack_dumps
from kaiyuan_recipes.training import run_logging
from kaiyuan_recipes.training.config import RunSettings, build_config, deterministic_env
from kaiyuan_recipes.training.validate import validate


def prepare_run_dirs(run: RunSettings) -> None:
    for path in (run.layout.checkpoints, run.layout.tensorboard, run.layout.logs, run.layout.state):
        path.mkdir(parents=True, exist_ok=True)


def worker_callbacks(cfg: Any, run: RunSettings) -> list[Any]:
    """The Megatron-Bridge callbacks a worker trains with."""
    from kaiyuan_recipes.training.metrics import RunMetricsCallback
    from kaiyuan_recipes.training.profiling import ProfileSummaryCallback

    callbacks = [RunMetricsCallback(run.layout.state, cfg.dataset.seq_length, run.fastpath)]
    if cfg.profiling is not None and cfg.profiling.use_pytorch_profiler:
        callbacks.append(ProfileSummaryCallback(run.run_dir, cfg.profiling))
    if not cfg.rerun_state_machine.check_for_nan_in_loss:  # e.g. kaiyuan.cuda_graph: Megatron's check is off
        from kaiyuan_recipes.training.loss_guard import NonFiniteLossCallback

        callbacks.append(NonFiniteLossCallback())
    return callbacks + fastpath.callbacks(run.fastpath) + run_logging.progress_callbacks(cfg)


def main(argv: list[str] | None = None) -> None:
    enable_stack_dumps()  # `kaiyuan stacks RUN`
    run_logging.quiet_upstream()  # before Megatron is imported: its import-time records
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m kaiyuan_recipes.training.entry RECIPE [section.field=value ...]")
    compat.apply()
    cfg, run = build_config(argv[0], argv[1:])
    os.environ.update(deterministic_env(cfg))  # before CUDA and NCCL read them
    validate(cfg, int(os.environ.get("WORLD_SIZE", "1")), run.max_positions)
    prepare_run_dirs(run)
    run_logging.start_console(cfg, run)  # the full log in logs/, the decided block

    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(cfg, forward_step, callbacks=worker_callbacks(cfg, run))


if __name__ == "__main__":
    main()
