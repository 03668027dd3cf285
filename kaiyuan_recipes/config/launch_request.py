"""What a launching process checks before a run is claimed, without Megatron, torch or transformers: the recipe,
the command line's overrides (syntax, `kaiyuan.*` knobs and their types, counts, and every container key against
the key list the stack's last full resolution recorded), and where the run lives.

The full resolution (the ConfigContainer, every `auto`) runs once, in the process that trains (training/plan.py),
and is the check of record: what is refused there ends the run before its first step, with the reason in the
console and `kaiyuan status`. This module only refuses early what it can decide in a fraction of a second."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.cache import cache_root
from kaiyuan_recipes.config import overrides as ov
from kaiyuan_recipes.config.knobs import Knobs
from kaiyuan_recipes.config.parallel_layout import parallel_layout_of
from kaiyuan_recipes.config.recipe_tree import load_recipe_tree, recipe_dir
from kaiyuan_recipes.config.run_layout import RunLayout

# The packages whose dataclasses give a ConfigContainer its keys: a key list recorded under other versions is
# not used.
STACK_PACKAGES = ("megatron-bridge", "megatron-core", "kaiyuan-recipes")
KEYS_FORMAT = 3  # 3: per data source, the keys the overrides apply to (after the source may swap the dataset class)


@dataclass(frozen=True)
class LaunchRequest:
    """A recipe and its overrides as checked on the launching host."""

    recipe: str
    overrides: tuple[str, ...]
    knobs: Knobs
    sections: dict[str, Any]  # the recipe's sections after the knob overrides, plain data (model, train, dataset…)
    profile: dict[str, Any]  # the recipe's `profile:` section (training/profiling.py)
    run_dir: Path
    keys_checked: bool  # the container keys were checked here (a recorded key list exists for this stack)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    @property
    def train_iters(self) -> int | None:
        """The run length as the recipe and the command line say (a curriculum phase decides it when resolved)."""
        value = self.value("train.train_iters")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


    def value(self, dotted: str) -> Any:
        """A container field as the command line or else the recipe sets it (None where neither does)."""
        for override in reversed(self.overrides):
            key, text = ov.split_key(override)
            if key == dotted:
                try:
                    return yaml.safe_load(text)
                except yaml.YAMLError:
                    return text
        section, _, name = dotted.partition(".")
        return (self.sections.get(section) or {}).get(name)

    def parallel_layout(self, world_size: int) -> dict[str, int] | None:
        """The layout of `world_size` ranks as the recipe's values give it (None where a value is not a plain
        positive integer here: the full resolution words that)."""
        names = ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                 "model.context_parallel_size", "train.micro_batch_size", "train.global_batch_size")
        values = [1 if self.value(n) is None and n.startswith("model.") else self.value(n) for n in names]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values) or world_size < 1:
            return None
        return parallel_layout_of(*values, world_size)


def check_launch_request(recipe: str, overrides: list[str]) -> LaunchRequest:
    """Refuses a misspelt recipe, a malformed override, an unknown or mistyped `kaiyuan.*` knob, a bad count and,
    where this stack's key list is recorded, an unknown container key — each naming the closest valid one."""
    tree = load_recipe_tree(recipe)
    knob_overrides = [o for o in overrides if ov.is_tree_override(o)]
    container_overrides = [o for o in overrides if o not in knob_overrides]
    ov.apply_to_tree(tree, knob_overrides)
    sections = OmegaConf.to_container(tree, resolve=True)
    assert isinstance(sections, dict)
    knobs = Knobs.from_mapping(sections.pop("kaiyuan", {}) or {})
    profile = sections.pop("profile", None) or {}
    recorded = recorded_keys(recipe, data_source_kind(knobs))
    if recorded is not None:
        ov.refuse_unknown_keys(container_overrides, recorded.keys, recorded.not_with_this_source,
                               lambda key: not_with_this_source(key, knobs, recorded.dataset_class))
    ov.refuse_bad_counts(container_overrides)
    run_dir = Path(knobs.run_root).expanduser().resolve() / (knobs.run_name or recipe)
    return LaunchRequest(recipe, tuple(overrides), knobs, sections, profile, run_dir, recorded is not None)


def _stack_fingerprint(recipe: str) -> str:
    """The installed versions of the stack and the recipe's model file (its provider class decides the model keys)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in STACK_PACKAGES:
        try:
            parts.append(f"{name}={version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name}=?")
    parts.append(hashlib.sha256((recipe_dir(recipe) / "model.yaml").read_bytes()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def data_source_kind(knobs: Knobs) -> str:
    """What decides the dataset section's class: the source named by kaiyuan.data, or `dirs` for converted ones."""
    return "dirs" if knobs.data_dirs is not None else str(knobs.data)


def not_with_this_source(key: str, knobs: Knobs, dataset_class: str) -> str:
    return (f"override {key}: not read with kaiyuan.data={data_source_kind(knobs)} (its dataset section is "
            f"{dataset_class}, which has no such field); it applies with other data sources")


@dataclass(frozen=True)
class RecordedKeys:
    keys: frozenset[str]  # what the overrides of a run on this source apply to
    not_with_this_source: frozenset[str]  # the recipe's keys that this source's dataset class lacks
    dataset_class: str


def keys_file(recipe: str, source: str) -> Path:
    return cache_root() / "container_keys" / f"{recipe}-{source}-{_stack_fingerprint(recipe)}.json"


def recorded_keys(recipe: str, source: str) -> RecordedKeys | None:
    """The container's dotted keys for `recipe` on data source `source` (data_source_kind) and this stack, as its
    last full resolution recorded them; None before any (then the process that trains checks the keys). A damaged
    file counts as none."""
    if os.environ.get("KAIYUAN_NO_KEY_CACHE") == "1" or "/" in source:
        return None
    try:
        record = json.loads(keys_file(recipe, source).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != KEYS_FORMAT or not all(
            isinstance(record.get(k), list) for k in ("keys", "not_with_this_source")):
        return None
    return RecordedKeys(frozenset(map(str, record["keys"])), frozenset(map(str, record["not_with_this_source"])),
                        str(record.get("dataset_class", "")))


def container_keys(cfg: Any) -> set[str]:
    keys = set(ov.dataclass_keys(cfg))
    if "dataset.sequence_length" in keys:  # what recipes and users write (overrides.py _to_field)
        keys.add("dataset.seq_length")
    return keys


def record_keys(recipe: str, source: str, keys: set[str], recipe_keys: set[str], dataset_class: str) -> None:
    """Called by every full resolution, once the data source is applied: the keys the overrides apply to on this
    source (and the recipe's that its dataset class lacks), for the next launch's early check. Best effort (a
    read-only cache only loses the early check)."""
    path = keys_file(recipe, source)
    try:
        if path.is_file():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({
            "format": KEYS_FORMAT, "recipe": recipe, "source": source, "keys": sorted(keys),
            "not_with_this_source": sorted(recipe_keys - keys),
            "dataset_class": dataset_class}) + "\n")
    except OSError:
        pass


__all__ = ["LaunchRequest", "check_launch_request", "container_keys", "data_source_kind", "keys_file",
           "not_with_this_source", "record_keys", "recorded_keys"]
