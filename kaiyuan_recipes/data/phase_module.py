"""PhaseBlendDataModule: one phase of a curriculum as Megatron-Bridge settings — the dataset config
(the phase's blend, the held-out set as validation split), the iteration at which the phase ends,
and a learning-rate schedule that is the same for every phase so it runs on without a restart:
warmup in phase 1, constant through the middle phases, decay over the last phase."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.blend import (
    BlendError,
    load_curriculum,
    phase_blend,
    phase_iterations,
    phase_order,
    to_megatron_blend,
)


def curriculum_path(name_or_path: str) -> Path:
    from kaiyuan_recipes.config.recipe_tree import shipped_yaml

    try:
        return shipped_yaml("curricula", name_or_path, "curriculum")
    except FileNotFoundError as err:
        raise BlendError(str(err)) from None


@dataclass
class PhaseBlendDataModule:
    curriculum: str
    phase: int
    tokenizer: str | None = None
    seq_length: int = 4096
    global_batch_size: int = 512
    heldout_prefix: str | None = None
    seed: int = 1234
    split: str = "99,1,0"

    def spec(self) -> dict[str, Any]:
        return load_curriculum(curriculum_path(self.curriculum))

    def iterations(self) -> dict[int, tuple[int, int]]:
        return phase_iterations(self.spec(), self.global_batch_size * self.seq_length)

    def schedule(self) -> dict[str, int]:
        bounds = self.iterations()
        last = max(bounds)
        # max_steps, not train_iters, sizes the whole schedule (decay and weight-decay steps): a phase
        # stops at its own last iteration, and Megatron refuses to resume a scheduler whose totals changed.
        return {
            "lr_decay_style": "WSD",
            "max_steps": bounds[last][1],
            "lr_decay_iters": bounds[last][1],
            "lr_wsd_decay_iters": bounds[last][1] - bounds[last][0] + 1,
        }

    def blend_fields(self) -> dict[str, Any]:
        fields = to_megatron_blend(phase_blend(self.spec(), self.phase), self.heldout_prefix)
        if fields.get("split", "keep") == "keep":
            fields["split"] = self.split
        return fields

    def order(self) -> str:
        return phase_order(self.spec(), self.phase)

    def dataset_config(self) -> Any:
        """A Megatron-Bridge GPTDatasetConfig for this phase (OrderedGPTDatasetConfig where it starts past sample 0)."""
        from megatron.bridge.training.config import GPTDatasetConfig

        config = GPTDatasetConfig(random_seed=self.seed, seq_length=self.seq_length, reset_attention_mask=False,
                                  reset_position_ids=False, eod_mask_loss=False, **self.blend_fields())
        return self._ordered(config)

    def _ordered(self, config: Any) -> Any:
        """The phase's own samples only: an ordered phase, or a shuffled one after the first, is indexed from its
        first sample on (ordered_dataset.py); the first shuffled phase is Bridge's own dataset config."""
        first_iteration = self.iterations()[self.phase][0]  # samples before it were the earlier phases'
        if self.order() == "shuffled" and first_iteration == 1:
            return config
        from kaiyuan_recipes.data.ordered_dataset import OrderedGPTDatasetConfig

        return OrderedGPTDatasetConfig.from_config(config, self.order(), (first_iteration - 1) * self.global_batch_size)

    def apply(self, cfg: Any) -> None:
        """Point a ConfigContainer at this phase: blend (and order), last iteration, continuous schedule. Whether
        a resumed checkpoint's schedule gives way is decided on the final config (adopt_schedule_over)."""
        for key, value in self.blend_fields().items():
            setattr(cfg.dataset, key, value)
        cfg.dataset.random_seed = self.seed
        cfg.dataset = self._ordered(cfg.dataset)
        cfg.train.train_iters = self.iterations()[self.phase][1]
        for key, value in self.schedule().items():
            setattr(cfg.scheduler, key, value)


SCHEDULE_FIELDS = ("lr_decay_style", "max_steps", "lr_decay_iters", "lr_wsd_decay_iters")


def adopt_schedule_over(cfg: Any, phase: int, overridden: set[str] | frozenset[str] = frozenset()) -> None:
    """A phase may resume a run that was not trained on this curriculum (a plain `kaiyuan train`): its checkpoint's
    scheduler has other totals, which Megatron refuses to resume. The run's schedule (the curriculum's, or an
    override's) takes over from the resumed step (override_opt_param_scheduler), and says so. `overridden`: the
    fields the user's overrides set; a scheduler flag named there is the user's, never turned over here."""
    import sys

    recorded = _recorded_scheduler(cfg.checkpoint.load)
    final = {k: getattr(cfg.scheduler, k) for k in SCHEDULE_FIELDS}
    differs = {k: (recorded[k], v) for k, v in final.items() if k in recorded and recorded[k] != v}
    if not differs:
        return
    keep_checkpoint = getattr(cfg.scheduler, "use_checkpoint_opt_param_scheduler", False)
    if keep_checkpoint or ("scheduler.override_opt_param_scheduler" in overridden
                           and not cfg.scheduler.override_opt_param_scheduler):
        asks = ("scheduler.use_checkpoint_opt_param_scheduler=true asks to keep it" if keep_checkpoint else
                "scheduler.override_opt_param_scheduler=false asks Megatron to refuse it")
        raise ValueError(f"phase {phase}: the checkpoint's schedule differs from the run's ({sorted(differs)}) and "
                         f"{asks}; drop that override to let the curriculum's schedule take over")
    cfg.scheduler.override_opt_param_scheduler = True
    shown = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in differs.items())
    print(f"kaiyuan: phase {phase} resumes a checkpoint trained on another schedule ({shown}): the run's schedule "
          "takes over from the resumed iteration (its learning rate there)", file=sys.stderr)


def _recorded_scheduler(checkpoint_dir: str | None) -> dict[str, Any]:
    """The scheduler section of the newest checkpoint's run_config.yaml under `checkpoint_dir` ({} if none)."""
    import yaml

    from kaiyuan_recipes.config.run_layout import RUN_CONFIG_FILE, RunLayout

    latest = RunLayout.latest_iteration_dir(Path(checkpoint_dir)) if checkpoint_dir else None
    if latest is None:
        return {}
    config = latest / RUN_CONFIG_FILE
    if not config.is_file():
        return {}
    recorded = yaml.safe_load(config.read_text()) or {}
    scheduler = dict(recorded.get("scheduler") or {})
    train = recorded.get("train") or {}
    if scheduler.get("max_steps") is None:
        scheduler["max_steps"] = _weight_decay_iters(scheduler, train)
    if scheduler.get("lr_decay_iters") is None:  # unset: Megatron sizes the decay by train_iters
        scheduler["lr_decay_iters"] = train.get("train_iters")
    return scheduler


def _weight_decay_iters(scheduler: dict[str, Any], train: dict[str, Any]) -> Any:
    """The iterations the recorded run sized its schedule by, where its record names no max_steps (unset, or a
    Bridge without that field: 0.5.0, whose record drops the attribute): what its resolved weight-decay total
    says (training records the config resolved), else train_iters (what Megatron falls back to)."""
    steps, batch = scheduler.get("wd_incr_steps"), train.get("global_batch_size")
    if steps and batch and train.get("train_samples") is None:
        return steps // batch
    return train.get("train_iters")
