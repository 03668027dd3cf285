"""What a training run is doing now, for `kaiyuan status` (run_state/phase.json: `setting up: <what>`, `training`,
`saving`, `finishing`), and when a SIGTERM becomes a graceful stop.

Megatron-Bridge installs its exit-signal handler (DistributedSignalHandler) as soon as pretrain hands the config to
its GlobalState, before set-up; the handler only sets a flag that the training loop reads after a step. A stop
during set-up (building the model, the dataset indices, loading a checkpoint: minutes on a large run) would wait
for all of it and a first step, then save a checkpoint of that step. So the config goes to pretrain with
train.exit_signal_handler off and SIGTERM at its default action, which ends the rank at once even inside a long C
call (an index build, a collective); there is nothing to save yet. RunPhaseCallback.on_train_start turns the
setting back on and asks the GlobalState for its handler (Bridge installs it then): from the first step on, a stop
saves a checkpoint as before, and a SIGTERM during a save lets the save complete."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from kaiyuan_recipes.compat.bridge_api import Callback
from kaiyuan_recipes.config.run_layout import RunLayout
from kaiyuan_recipes.run_states import Phase
from kaiyuan_recipes.training.phase_file import write_phase


def hold_stop_handler_until_training(cfg: Any) -> bool:
    """Before pretrain: keep Bridge's exit-signal handler out of set-up (the module docstring says why). Returns
    whether the config asked for it, for RunPhaseCallback."""
    wanted = bool(cfg.train.exit_signal_handler)
    cfg.train.exit_signal_handler = False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever a parent left: ignored dispositions survive exec
    return wanted


def checkpoint_will_load(cfg: Any) -> bool:
    ckpt = cfg.checkpoint
    loads = ckpt.load is not None and RunLayout.latest_iteration_dir(Path(ckpt.load)) is not None
    return loads or bool(getattr(ckpt, "pretrained_checkpoint", None))


def watch_model_build(cfg: Any, state_dir: Path) -> None:
    """The set-up phase after the model is built (a pre-wrap hook, which Bridge runs right after construction)."""
    after = f"{Phase.SETTING_UP}: {'loading checkpoint' if checkpoint_will_load(cfg) else 'building the optimizer'}"

    def model_built(model: list[Any]) -> list[Any]:
        write_phase(state_dir, after)
        return model

    cfg.model.register_pre_wrap_hook(model_built)


class RunPhaseCallback(Callback):
    def __init__(self, state_dir: Path, exit_signal_handler: bool):
        self.state_dir = Path(state_dir)
        self.exit_signal_handler = exit_signal_handler
        self.stop_requested = False
        self._phase: str | None = None

    def _set(self, phase: str) -> None:
        if phase != self._phase:
            self._phase = phase
            write_phase(self.state_dir, phase)

    def on_data_init_start(self, context: Any) -> None:
        self._set(f"{Phase.SETTING_UP}: building dataset indices")

    def on_train_start(self, context: Any) -> None:
        if self.exit_signal_handler:
            context.state.cfg.train.exit_signal_handler = True
            context.state.signal_handler  # noqa: B018  (the property installs Bridge's handler, now)
            bridge = signal.getsignal(signal.SIGTERM)
            if callable(bridge):
                def stop(signum: int, frame: Any) -> None:  # noted for the phase, then Bridge's own handling
                    self.stop_requested = True
                    bridge(signum, frame)

                signal.signal(signal.SIGTERM, stop)
        self._set(Phase.TRAINING)

    def on_train_step_start(self, context: Any) -> None:
        self._set(Phase.TRAINING)

    def on_train_step_end(self, context: Any) -> None:
        cfg, step = context.state.cfg, context.state.train_state.step + 1  # the iteration this step completes
        interval = cfg.checkpoint.save_interval
        due = self.stop_requested or (interval and step % interval == 0) or step >= cfg.train.train_iters
        if cfg.checkpoint.save and due:
            self._set(Phase.SAVING)

    def on_checkpoint_save(self, context: Any) -> None:
        self._set(Phase.TRAINING)

    def on_train_end(self, context: Any) -> None:
        self._set(Phase.FINISHING)
