"""Whether the data a run names is on this host, decided in a moment from the launch request's plain values (no
Megatron, no config): what a launch whose ranks train here (`kaiyuan train`, `kaiyuan start` without --ssh or
--slurm) refuses before the run is claimed. The ranks' full check (data/preflight.py check_data, through
training/validate.py) stays the check of record: it also weighs, splits and compares tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kaiyuan_recipes.config.knobs import Knobs
from kaiyuan_recipes.data.preflight import PreflightError, missing_prefix, prefix_present


def refuse_data_missing_here(knobs: Knobs, blend: Any, blend_per_split: Any) -> None:
    """The converted directories, the plan's or the curriculum phase's sources (their manifests), or the dataset
    blend's prefixes (`.bin`/`.idx`) that are not on this host: the first one missing, named, with the closest
    existing one where there is one."""
    from kaiyuan_recipes.data.blend import BlendError, load_curriculum, load_plan, phase_blend, plan_path
    from kaiyuan_recipes.data.converted import resolve_data_dirs
    from kaiyuan_recipes.data.phase_module import curriculum_path

    if knobs.data_dirs is not None:
        resolve_data_dirs(knobs.data_dirs, knobs.data_weights)
    elif knobs.data == "plan" and knobs.plan:
        path = plan_path(knobs.plan)
        try:
            load_plan(path)
        except BlendError as err:  # which file named the missing source, and where relative paths start
            raise _named(err, f"kaiyuan.plan={knobs.plan}", path) from None
    elif knobs.data == "curriculum" and knobs.curriculum and knobs.phase:
        path = curriculum_path(knobs.curriculum)
        try:
            phase_blend(load_curriculum(path), int(knobs.phase))
        except BlendError as err:
            raise _named(err, f"kaiyuan.curriculum={knobs.curriculum}", path) from None
    elif knobs.data == "blend":
        for prefix in _prefixes(blend) + _prefixes(blend_per_split):
            if not prefix_present(prefix):
                raise PreflightError(f"dataset.blend: {missing_prefix(prefix)}")


def _named(err: Exception, knob: str, path: Path) -> Exception:
    """`err` (a source the file names is missing) with the file and where its relative directories start."""
    text = str(err)
    if text.startswith(str(path)):
        return err
    return type(err)(f"{knob} ({path}; relative dirs from {Path.cwd()}): {text}")


def _prefixes(value: Any) -> list[str]:
    """The path prefixes in a blend value as given ([[prefix, …], weights], per split a list of those) that can be
    decided here. Left to the ranks' check: text that is no list (an override the plain parse could not read, as
    Hydra's `[[${oc.env:DATA}/x],null]`) and an interpolation OmegaConf cannot resolve alone (Bridge resolves it
    against the whole config when it applies the overrides)."""
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in (_resolved(item) if isinstance(item, str) else _prefixes(item)) if p]
    return []


def _resolved(prefix: str) -> list[str]:
    if "${" not in prefix:
        return [prefix]
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return [str(OmegaConf.create({"prefix": prefix}).prefix)]  # ${oc.env:…}, as Bridge's resolution reads it
    except OmegaConfBaseException:
        return []
