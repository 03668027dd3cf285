"""Hydra-style command-line overrides (`section.field=value`) with errors that name the closest
valid key. Recipe knobs (`kaiyuan.*`, `profile.*`) apply to the recipe tree; everything else is applied to the
built ConfigContainer by Megatron-Bridge's own override machinery."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Collection, Iterable

from omegaconf import DictConfig, OmegaConf

# Sections of the recipe tree that are ours, not Megatron-Bridge ConfigContainer sections.
TREE_SECTIONS = ("kaiyuan", "profile")


class OverrideError(ValueError):
    pass


def is_tree_override(override: str) -> bool:
    return split_key(override)[0].split(".", 1)[0] in TREE_SECTIONS


def split_key(override: str) -> tuple[str, str]:
    body = override.lstrip("+~")
    if "=" not in body:
        raise OverrideError(f"override {override!r}: expected section.field=value")
    key, value = body.split("=", 1)
    if not key or key != key.strip():
        raise OverrideError(f"override {override!r}: empty or padded key")
    return key, value


def closest_key(key: str, candidates: Iterable[str]) -> str:
    match = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.5)
    return f"; closest valid key: {match[0]}" if match else ""


def dataclass_keys(obj: Any, prefix: str = "", depth: int = 2) -> list[str]:
    """Dotted keys of a (nested) dataclass instance, for suggestions."""
    keys = []
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        dotted = f"{prefix}{f.name}"
        keys.append(dotted)
        value = getattr(obj, f.name, None)
        if depth > 1 and dataclasses.is_dataclass(value) and not isinstance(value, type):
            keys.extend(dataclass_keys(value, dotted + ".", depth - 1))
    return keys


def apply_to_tree(tree: DictConfig, overrides: list[str]) -> None:
    """Apply `kaiyuan.*` and `profile.*` overrides to the recipe tree; unknown keys are errors."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    valid = [f"{section}.{k}" for section in TREE_SECTIONS for k in tree.get(section, {})]
    for override in overrides:
        key, _ = split_key(override)
        if key not in valid:
            raise OverrideError(f"unknown override key {key!r}{closest_key(key, valid)}")
    OmegaConf.set_struct(tree, True)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
        ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=tree)
    except Exception as err:  # hydra's parser and OmegaConf's validation errors
        raise OverrideError(f"cannot apply {overrides}: {str(err).splitlines()[0]}") from err
    OmegaConf.set_struct(tree, False)


def _to_field(cfg: Any, override: str) -> str:
    """`dataset.seq_length` (what recipes and users write) names the field megatron-bridge has: 0.6 made seq_length
    GPTDatasetConfig's field; 0.5 has it as a property over megatron-core's field `sequence_length`, which is
    what the override machinery (dataclass fields) sees."""
    key, value = split_key(override)
    dataset = getattr(cfg, "dataset", None)
    if key != "dataset.seq_length" or not dataclasses.is_dataclass(dataset):
        return override
    names = {f.name for f in dataclasses.fields(dataset)}
    if "seq_length" in names or "sequence_length" not in names:
        return override
    return override[: len(override) - len(override.lstrip("+~"))] + f"dataset.sequence_length={value}"


# Container fields that count something and must be at least 1 (None: unset, where upstream allows it). Megatron
# divides by most of them: 0 or a negative gets past its own checks into a ZeroDivisionError or a negative model.
POSITIVE_INTEGERS = (
    "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.num_query_groups", "model.kv_channels", "model.vocab_size", "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size", "model.context_parallel_size", "train.micro_batch_size",
    "train.global_batch_size", "train.train_iters", "logger.log_interval", "dataset.seq_length",
)
# Intervals where upstream reads 0 as "never" (no periodic save, no evaluation): a negative is the mistake.
NON_NEGATIVE_INTEGERS = ("checkpoint.save_interval", "validation.eval_interval", "validation.eval_iters")
REQUIRED = ("model.num_layers", "model.hidden_size", "model.num_attention_heads", "train.micro_batch_size",
            "logger.log_interval", "dataset.seq_length")


def not_a_count(key: str, value: Any) -> str | None:
    """Why `value` cannot be `key` (one of POSITIVE_INTEGERS or NON_NEGATIVE_INTEGERS), or None."""
    if value is None and key not in REQUIRED:
        return None  # unset: derived or optional upstream (train.train_iters: or train.train_samples)
    least = 0 if key in NON_NEGATIVE_INTEGERS else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        return f"{key}={value!r}: expected {'an integer, 0 or more' if least == 0 else 'a positive integer'}"
    return None


def refuse_bad_counts(overrides: list[str]) -> None:
    """Before upstream applies them: a model field is checked as the provider is rebuilt, which divides by it."""
    import yaml

    for override in overrides:
        key, text = split_key(override)
        if key in POSITIVE_INTEGERS or key in NON_NEGATIVE_INTEGERS:
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                continue  # upstream's parser words its own error
            if not isinstance(value, (int, float)):
                continue  # not a number at all: the type check after upstream's parse words it
            problem = not_a_count(key, value)
            if problem:
                raise OverrideError(f"override {problem}")


def refuse_unknown_keys(overrides: list[str], keys: Collection[str], lacking: Collection[str] = (),
                        why_lacking: Callable[[str], str] = str) -> None:
    """Each override names one of `keys` (`+key=` adds one), else it is refused naming the closest; a key of
    `lacking` (known elsewhere, not here) is refused with `why_lacking(key)`."""
    sections = {k.split(".", 1)[0] for k in keys}
    for override in overrides:
        key, _ = split_key(override)
        if override.startswith("+") or key in keys:
            continue
        if key in lacking:
            raise OverrideError(why_lacking(key))
        if key.split(".", 1)[0] not in sections:
            raise OverrideError(f"unknown override section in {key!r}{closest_key(key, keys)}")
        raise OverrideError(f"unknown override key {key!r}{closest_key(key, keys)}")


def apply_to_container(cfg: Any, overrides: list[str]) -> dict[str, Any]:
    """Apply overrides to a ConfigContainer through Megatron-Bridge's process_config_with_overrides, their keys
    (refuse_unknown_keys) and counts (refuse_bad_counts) checked by the caller; returns each overridden field
    (dotted) with the value it now has (the run records what the user set)."""
    if not overrides:
        return {}
    from megatron.bridge.training.utils.omegaconf_utils import OverridesError, process_config_with_overrides

    overrides = [_to_field(cfg, o) for o in overrides]
    before = {key: get_field(cfg, key) for key in (split_key(o)[0] for o in overrides)}
    try:
        process_config_with_overrides(cfg, cli_overrides=list(overrides))
    except OverridesError as err:
        raise OverrideError(str(err)) from err
    for key, old in before.items():
        new = get_field(cfg, key)
        # an integer field given a fraction (1.5 iterations); 65536.0 stays for the float fields whose default is int
        if (_numeric(old) and not _numeric(new)) or (type(old) is int and type(new) is float and not new.is_integer()):
            raise OverrideError(f"override {key}={new!r}: expected {_KIND.get(type(old), type(old).__name__)}")
        if isinstance(new, str) and _is_dtype_field(cfg, key):
            _set(cfg, key, _dtype(key, new))
    return {key: get_field(cfg, key) for key in before}


def value_once_applied(cfg: Any, overrides: list[str], dotted: str) -> Any:
    """What field `dotted` will hold once apply_to_container applies `overrides` to `cfg` (Bridge's Hydra parse, then
    OmegaConf's resolution of `${…}`), `cfg` left as it is: for a value a step before the overrides must read and
    the command line gives as an interpolation. Overrides of keys `cfg` does not have yet are left out."""
    from megatron.bridge.training.utils.omegaconf_utils import (
        OverridesError,
        create_omegaconf_dict_config,
        parse_hydra_overrides,
    )
    from omegaconf.errors import OmegaConfBaseException

    conf, _ = create_omegaconf_dict_config(cfg)
    known = set(dataclass_keys(cfg))
    applicable = [o for o in (_to_field(cfg, o) for o in overrides) if split_key(o)[0] in known]
    field, _ = split_key(_to_field(cfg, f"{dotted}=_"))  # the name the container has (dataset.seq_length)
    try:
        return OmegaConf.select(parse_hydra_overrides(conf, applicable), field)
    except (OverridesError, OmegaConfBaseException) as err:
        raise OverrideError(f"override {dotted}: {str(err).splitlines()[0]}") from err


# torch.dtype fields (e.g. ddp.megatron_fsdp_grad_comm_dtype) arrive from the command line as text; upstream's
# override machinery leaves them as str, which fails deep inside the run.
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
          "fp32": "float32", "float32": "float32", "float": "float32"}


def _is_dtype_field(cfg: Any, dotted: str) -> bool:
    parent_key, _, name = dotted.rpartition(".")
    parent = get_field(cfg, parent_key) if parent_key else cfg
    fields = {f.name: f for f in dataclasses.fields(parent)} if dataclasses.is_dataclass(parent) else {}
    return name in fields and "dtype" in str(fields[name].type)


def _dtype(key: str, text: str) -> Any:
    import torch

    name = DTYPES.get(text.removeprefix("torch."))
    if name is None:
        raise OverrideError(f"override {key}={text!r}: expected a dtype, one of {sorted(DTYPES)}")
    return getattr(torch, name)


_KIND = {bool: "true or false", int: "an integer", float: "a number"}


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float))  # bool included


def get_field(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def _set(obj: Any, dotted: str, value: Any) -> None:
    parent_key, _, name = dotted.rpartition(".")
    setattr(get_field(obj, parent_key) if parent_key else obj, name, value)
