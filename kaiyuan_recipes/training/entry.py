"""What each torchrun worker runs: build the recipe's ConfigContainer and call Megatron-Bridge's
pretrain with its GPT forward step. `python -m kaiyuan_recipes.training.entry RECIPE [overrides]`.

Under `kaiyuan train` / `start` the rank joins its run first (launch/membership.py: the run's lock, and SIGTERM
when torchrun dies), records its set-up phase for `kaiyuan status`, and ends at once on a SIGTERM until training
starts (training/run_phase.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kaiyuan_recipes import compat, fastpath
from kaiyuan_recipes.data.cache_warmup import finish_cache_warmup, start_cache_warmup
from kaiyuan_recipes.launch.membership import join_run_from_env
from kaiyuan_recipes.launch.stacks import enable_stack_dumps
from kaiyuan_recipes.run_states import Phase
from kaiyuan_recipes.training import run_logging
from kaiyuan_recipes.training.config import RunSettings, deterministic_env
from kaiyuan_recipes.training.phase_file import supervised_state_dir, write_phase
from kaiyuan_recipes.training.plan import plan_line, resolve_for_rank
from kaiyuan_recipes.training.validate import validate


def worker_callbacks(cfg: Any, run: RunSettings, phase: Any = None) -> list[Any]:
    """The Megatron-Bridge callbacks a worker trains with (`phase`: its RunPhaseCallback)."""
    from kaiyuan_recipes.training.console_progress import ConsoleProgressCallback
    from kaiyuan_recipes.training.metrics import RunMetricsCallback
    from kaiyuan_recipes.training.profiling import ProfileSummaryCallback

    callbacks = [RunMetricsCallback(run.layout.state, cfg.dataset.seq_length, run.fastpath)]
    if run.heldout_eval is not None:  # after the step's metrics line; the next step's clock restarts after it
        from kaiyuan_recipes.training.heldout_eval.callback import heldout_eval_callback

        callbacks.append(heldout_eval_callback(cfg, run, after_eval=callbacks[0].on_eval_start))
    if phase is not None:
        callbacks.append(phase)
    if cfg.profiling is not None and cfg.profiling.use_pytorch_profiler:
        callbacks.append(ProfileSummaryCallback(run.run_dir, cfg.profiling))
    if not cfg.rerun_state_machine.check_for_nan_in_loss:  # e.g. kaiyuan.cuda_graph: Megatron's check is off
        from kaiyuan_recipes.training.loss_guard import NonFiniteLossCallback

        callbacks.append(NonFiniteLossCallback())
    progress = ConsoleProgressCallback(cfg.logger.log_interval, cfg.dataset.seq_length)  # the console's line
    return callbacks + fastpath.callbacks(run.fastpath) + [progress]


def require_cuda() -> None:
    """Megatron trains on CUDA only (its initialisation asserts it). Said here in words a person acts on, after the
    set-up that needs no GPU has checked the config and data (the rest of set-up runs inside pretrain)."""
    import torch

    if not torch.cuda.is_available():
        print("kaiyuan: error: training needs a CUDA GPU and this host has none visible "
              "(torch.cuda.is_available() is False); `kaiyuan train RECIPE --dry-run` checks a run without one",
              file=sys.stderr, flush=True)
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    enable_stack_dumps()  # `kaiyuan stacks RUN`
    run_logging.quiet_upstream()  # before Megatron is imported: its import-time records
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m kaiyuan_recipes.training.entry RECIPE [section.field=value ...]")
    join_run_from_env()
    phase_dir = supervised_state_dir()
    if phase_dir is not None:
        write_phase(phase_dir, f"{Phase.SETTING_UP}: building the config")
    # each node's first rank: the node's cached inputs are prepared beside the imports below
    warmup = start_cache_warmup(argv[0], argv[1:]) if os.environ.get("LOCAL_RANK", "0") == "0" else None
    compat.apply()
    import megatron.training.training  # noqa: F401  (its import installs Megatron's console handler: basicConfig)

    run_logging.quiet_console()  # the resolution below logs and prints upstream's set-up chatter
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # Rank 0 resolves (every `auto` decided here, on the training node) and checks: Bridge's own validation and the
    # data's check. The launching process checked only what it could without Megatron, so this is where a launch the
    # config or the data cannot train is refused, before the model is built. The other ranks load rank 0's plan
    # (training/plan.py); its verdict is theirs.
    try:
        cfg, run, record = resolve_for_rank(
            argv[0], argv[1:], check=lambda c, r: validate(c, r, world_size, upstream=True, data_here=True))
        if os.environ.get("RANK", "0") != "0" and os.environ.get("LOCAL_RANK", "0") == "0":
            validate(cfg, run, world_size, upstream=False, data_here=True)  # the data as this node sees it
    except ValueError as err:  # the config's, the data's, the overrides' and a differing stack's errors name it
        print(f"kaiyuan: error: the run's plan was refused: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        finish_cache_warmup(warmup)
    if run.data_check is not None:
        for line in run.data_check.lines():
            print(f"kaiyuan: {line}", flush=True)
    os.environ.update(deterministic_env(cfg))  # before CUDA and NCCL read them
    run.layout.make_dirs()
    print(plan_line(record, int(os.environ.get("RANK", "0"))), flush=True)
    phase_dir = phase_dir or run.layout.state
    if os.environ.get("RANK", "0") == "0" and getattr(cfg.dataset, "path_to_cache", None):
        from kaiyuan_recipes.data.index_cache import sweep_incomplete

        # A run stopped during an earlier set-up may have cut an index file short, which Megatron takes for cached.
        for path in sweep_incomplete(Path(cfg.dataset.path_to_cache)):
            print(f"kaiyuan: removed a truncated dataset index file (rebuilt now): {path}", file=sys.stderr)

    from kaiyuan_recipes.training.run_phase import (
        RunPhaseCallback,
        hold_stop_handler_until_training,
        watch_model_build,
    )

    phase = RunPhaseCallback(phase_dir, hold_stop_handler_until_training(cfg))
    watch_model_build(cfg, phase_dir)
    write_phase(phase_dir, f"{Phase.SETTING_UP}: initializing and building the model")
    run_logging.start_console(cfg, run)  # the full log in logs/, the decided block

    require_cuda()
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(cfg, forward_step, callbacks=worker_callbacks(cfg, run, phase))


if __name__ == "__main__":
    main()
