"""PhaseBlendDataModule: one phase of a curriculum as Megatron-Bridge settings — the dataset config
(the phase's blend, the held-out set as validation split), the iteration at which the phase ends,
and a learning-rate schedule that is the same for every phase so it runs on without a restart:
warmup in phase 1, constant through the middle phases, decay over the last phase."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.blend import BlendError, load_curriculum, phase_blend, phase_iterations, to_megatron_blend


def curriculum_path(name_or_path: str) -> Path:
    from kaiyuan_recipes.recipe_tree import shipped_yaml

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

    def dataset_config(self) -> Any:
        """A Megatron-Bridge GPTDatasetConfig for this phase."""
        from megatron.bridge.training.config import GPTDatasetConfig

        return GPTDatasetConfig(random_seed=self.seed, seq_length=self.seq_length, reset_attention_mask=False,
                                reset_position_ids=False, eod_mask_loss=False, **self.blend_fields())

    def apply(self, cfg: Any) -> None:
        """Point a ConfigContainer at this phase: blend, last iteration, continuous schedule."""
        for key, value in self.blend_fields().items():
            setattr(cfg.dataset, key, value)
        cfg.dataset.random_seed = self.seed
        cfg.train.train_iters = self.iterations()[self.phase][1]
        for key, value in self.schedule().items():
            setattr(cfg.scheduler, key, value)
