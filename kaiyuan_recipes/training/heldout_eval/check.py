"""kaiyuan.heldout_eval checked with the config's other cross-checks (training/validate.py): every launcher
(`kaiyuan train`, `start`, `slurm`, the dry run and each worker) refuses a bad file or an unsupported layout before
any training, not at the first evaluation. No torch here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.heldout_scoring import HeldoutFileError, Sample, read_samples_strict


class HeldoutEvalConfigError(ValueError):
    pass


def eval_interval(cfg: Any, run: Any) -> int:
    """kaiyuan.heldout_eval_interval, else the validation interval."""
    interval = run.heldout_eval_interval or getattr(cfg.validation, "eval_interval", None)
    if not interval:
        raise HeldoutEvalConfigError("kaiyuan.heldout_eval: no interval; set kaiyuan.heldout_eval_interval (or "
                                     "validation.eval_interval)")
    return int(interval)


def check_heldout_eval(cfg: Any, run: Any) -> list[Sample]:
    """The samples of kaiyuan.heldout_eval, or an error that names the file and line, or the setting, at fault."""
    m = cfg.model
    if m.pipeline_model_parallel_size > 1 or getattr(m, "virtual_pipeline_model_parallel_size", None):
        # Megatron's pipeline forward runs only inside its schedules, which feed fixed-shape micro-batches
        # through point-to-point sends between stages; a scorer of its own would have to reproduce them.
        raise HeldoutEvalConfigError(f"kaiyuan.heldout_eval: pipeline_model_parallel_size="
                                     f"{m.pipeline_model_parallel_size} is not supported (the evaluation runs the "
                                     "model's forward on each rank); score a checkpoint with `kaiyuan eval heldout`")
    if m.context_parallel_size > 1:
        raise HeldoutEvalConfigError(f"kaiyuan.heldout_eval: context_parallel_size={m.context_parallel_size} is not "
                                     "supported (samples are scored whole on each rank)")
    if cfg.tokenizer.tokenizer_type != "HuggingFaceTokenizer":
        raise HeldoutEvalConfigError(f"kaiyuan.heldout_eval: tokenizer.tokenizer_type={cfg.tokenizer.tokenizer_type}"
                                     "; the held-out text is tokenized with a Hugging Face tokenizer directory (set "
                                     "kaiyuan.tokenizer; kaiyuan.data=mock has none)")
    eval_interval(cfg, run)
    try:
        return read_samples_strict(Path(run.heldout_eval).expanduser())
    except HeldoutFileError as err:
        raise HeldoutEvalConfigError(f"kaiyuan.heldout_eval: {err}") from None
