"""Checkpoint averaging (`kaiyuan average RUN --last N OUT`): the weighted mean of the model weights of a run's last
N torch_dist checkpoints, written as a new torch_dist checkpoint. The fix the Kaiyuan authors' companion paper (CMA,
arXiv 2511.18903) proposes for an ascending-quality curriculum under LR decay.

Each checkpoint is rebuilt as a model the way export rebuilds it (Megatron-Bridge's AutoBridge.load_megatron_model,
megatron-core's dist_checkpointing underneath, any data-parallel layout); the mean is taken in fp32 and cast back to
each parameter's dtype; the result is written with Megatron-Bridge's save_megatron_model (weights only: the optimizer
state is dropped, as no average of Adam moments is one) beside the newest source's run_config.yaml, so `kaiyuan
export hf`, `kaiyuan serve`, and training from it (checkpoint.pretrained_checkpoint=OUT) read it like any other."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import atomic_directory, require_new_output
from kaiyuan_recipes.ckpt.screen import screen_pickles
from kaiyuan_recipes.ckpt.store import TRACKER, CheckpointError, checkpoint_format, refuse_links
from kaiyuan_recipes.config.run_layout import (
    ITER_DIR,
    RUN_CONFIG_FILE,
    RunLayout,
    checkpoint_root,
    iteration_dirs,
    iteration_of,
)

from .megatron_to_hf import (
    bridge_for,
    checkpoint_shape,
    ensure_single_process_group,
    newest_iteration_dir,
    rebuild_overrides,
)

SOURCES_FILE = "averaged_from.json"  # in the new iter_* directory: what was averaged, with which weights


@dataclass
class AverageReport:
    out: str
    checkpoint: str  # the iter_* directory written
    sources: list[str]
    weights: list[float]
    tensors: int
    parameters: int
    optimizer_state: str = "dropped (weights only: load with checkpoint.pretrained_checkpoint, or export / serve)"


def normalised_weights(weights: list[float], chosen: list[Path]) -> list[float]:
    """Weights that sum to 1, refusing NaN, infinities, negatives and an all-zero list (each named with its
    checkpoint). Scaled by the largest first, so weights near the float maximum do not overflow the sum."""
    for w, ckpt in zip(weights, chosen):
        if not math.isfinite(w) or w < 0:
            raise CheckpointError(f"--weights: {w!r} for {ckpt.name} is not a finite non-negative number")
    largest = max(weights)
    if largest == 0:
        raise CheckpointError(f"--weights {','.join(repr(w) for w in weights)}: all zero; give at least one "
                              "positive weight")
    scaled = [w / largest for w in weights]
    return [w / sum(scaled) for w in scaled]


def _holds_saves(folder: Path) -> bool:
    """A folder Megatron-Bridge treats as a checkpoints folder: the tracker file or iter_* directories in it, or
    a run's checkpoints/ (beside its run_state/) that has no save yet."""
    if not folder.is_dir():
        return False
    if (folder / TRACKER).is_file() or any(ITER_DIR.match(p.name) and p.is_dir() for p in folder.iterdir()):
        return True
    return folder == RunLayout(folder.parent).checkpoints and RunLayout(folder.parent).state.is_dir()


def check_output(out: Path) -> None:
    """The new checkpoint lies outside every run's checkpoints folder: inside one, Megatron-Bridge would count
    its iter_* among the run's saves (keep-last-K keeps it as the newest; a resume may load it)."""
    for folder in Path(out).absolute().parents:
        folder = folder.resolve()
        if _holds_saves(folder) or ITER_DIR.match(folder.name):
            raise CheckpointError(f"{out}: inside {folder}, a run's checkpoints; write the average outside it "
                                  "(e.g. beside the run directory)")


def choose_checkpoints(run: Path, last: int, weights: list[float] | None) -> tuple[list[Path], list[float]]:
    """The last `last` iter_* directories of `run` (oldest first) and their normalised weights (default equal)."""
    root = checkpoint_root(run)
    saved = iteration_dirs(root)
    if last < 1:
        raise CheckpointError(f"--last {last}: expected at least 1")
    if len(saved) < last:
        raise CheckpointError(f"{root}: {len(saved)} checkpoint(s) ({', '.join(p.name for p in saved) or 'none'}); "
                              f"--last {last} needs {last} (keep them with kaiyuan.average_last={last})")
    chosen = saved[-last:]
    weights = [1.0] * last if weights is None else [float(w) for w in weights]
    if len(weights) != last:
        raise CheckpointError(f"--weights: {len(weights)} value(s) for --last {last}; give one per checkpoint, "
                              "oldest first")
    weights = normalised_weights(weights, chosen)
    for ckpt in chosen:
        refuse_links(ckpt)  # upstream's loader would follow a link to a shard elsewhere
        if checkpoint_format(ckpt) != "torch_dist":
            raise CheckpointError(f"{ckpt}: format {checkpoint_format(ckpt)}; averaging reads torch_dist checkpoints")
    return chosen, weights


def average_checkpoints(run: Path, out: Path, last: int, weights: list[float] | None = None,
                        show_progress: bool = True) -> AverageReport:
    import torch

    out = Path(out)
    require_new_output(out)
    check_output(out)
    chosen, weights = choose_checkpoints(run, last, weights)
    for ckpt in chosen:
        screen_pickles(ckpt)  # upstream's loader below unpickles without restriction: nothing else may be in them
    newest = chosen[-1]
    shape = checkpoint_shape(newest)  # the shape export reads back, from each save's run_config.yaml
    for ckpt in chosen[:-1]:
        other = checkpoint_shape(ckpt).fields
        if other != shape.fields:
            differs = {k: (other.get(k), shape.get(k)) for k in set(other) | set(shape.fields)
                       if other.get(k) != shape.get(k)}
            raise CheckpointError(f"{ckpt}: another model shape than {newest.name} ({differs}); only checkpoints "
                                  "of one model average")
    ensure_single_process_group()
    bridge = bridge_for(shape)
    sums: dict[str, torch.Tensor] = {}
    model = None
    progress = _progress(show_progress)
    for ckpt, weight in zip(chosen, weights):
        progress(f"reading {ckpt.name} (weight {weight:.4g})")
        model = None  # the previous checkpoint's model goes before the next loads: one model and the sums at a time
        model = load_model(bridge, ckpt, shape)
        module = (model if isinstance(model, list) else [model])[0]
        for name, tensor in _weights(module).items():
            scaled = tensor.detach().float() * weight
            sums[name] = scaled if name not in sums else sums[name].add_(scaled)
    module = (model if isinstance(model, list) else [model])[0]
    with torch.no_grad():
        for name, tensor in _weights(module).items():
            tensor.copy_(sums[name].to(tensor.dtype))
    from megatron.bridge.training.model_load_save import save_megatron_model
    from torch.distributed.checkpoint.api import CheckpointException

    progress(f"writing {out}")
    try:
        with atomic_directory(out) as tmp:
            save_megatron_model([module], tmp)
            written = newest_iteration_dir(tmp)
            shutil.copy2(newest / RUN_CONFIG_FILE, written / RUN_CONFIG_FILE)
            report = AverageReport(out=str(out), checkpoint=str(out / written.name),
                                   sources=[str(c) for c in chosen], weights=weights, tensors=len(sums),
                                   parameters=sum(t.numel() for t in sums.values()))
            (written / SOURCES_FILE).write_text(json.dumps(
                asdict(report) | {"iterations": [iteration_of(c) for c in chosen]}, indent=2) + "\n")
    except (OSError, CheckpointException) as err:  # DCP's per-rank wrapper is a BaseException
        raise CheckpointError(f"{out}: cannot write the average ({write_failure(err, out.absolute().parent)}); "
                              "nothing was left there") from None
    return report


def write_failure(err: BaseException, folder: Path) -> str:
    """Why a write into `folder` failed, in one line: the OS's reason (a full or read-only disk, no permission),
    also from inside DCP's per-rank wrapper, and the space left there (torch's writer on a full disk says only
    that a file ended short of where it should)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from kaiyuan_recipes.ckpt.unpickle import describe_failure

    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]  # (exception, traceback)
    if isinstance(err, OSError) and err.strerror:
        reason = err.strerror
    elif "Worker failure" in str(err):  # megatron-core's writer process: it logged its error above
        reason = "the checkpoint writer failed, as logged above"
    else:
        reason = describe_failure(err)
    try:
        return f"{reason}; {shutil.disk_usage(folder).free / 2**20:,.1f} MiB free there"
    except OSError:
        return reason


def load_model(bridge: Any, ckpt: Path, shape: Any) -> Any:
    """Bridge's load_megatron_model of one checkpoint; a damaged one is a one-line error naming its damaged file
    (found by `kaiyuan ckpt verify`'s reader), not upstream's traceback."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return bridge.load_megatron_model(str(ckpt), mp_overrides=rebuild_overrides(shape), wrap_with_ddp=False)
    except (Exception, CheckpointException) as err:  # DCP's wrapper is a BaseException
        from kaiyuan_recipes.ckpt.unpickle import describe_failure
        from kaiyuan_recipes.ckpt.verify import verify_checkpoint

        problems = verify_checkpoint(ckpt).problems
        if problems:
            raise CheckpointError(f"{problems[0].file}: {problems[0].what}") from err
        raise CheckpointError(f"{ckpt}: does not load ({describe_failure(err)})") from err


def _weights(module: Any) -> dict[str, Any]:
    """The model's floating-point tensors by state_dict key (Transformer Engine's _extra_state entries are not
    weights)."""
    import torch

    return {k: v for k, v in module.state_dict().items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not k.endswith("_extra_state")}


def _progress(show: bool) -> Any:
    if not show:
        return lambda message: None
    from rich.console import Console

    console = Console(stderr=True)
    return lambda message: console.print(f"[dim]kaiyuan average:[/dim] {message}")
