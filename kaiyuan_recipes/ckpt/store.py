"""A run's checkpoints on disk: which iteration directories exist, and the small files each one holds
(torch.distributed.checkpoint's .metadata, megatron-core's metadata.json, Megatron-Bridge's run_config.yaml
and train_state.pt). Reading these needs torch only; no tensor data is read here."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# Where a run's saves are and which is the newest is decided in config/run_layout.py (status and export ask too).
from kaiyuan_recipes.config.run_layout import (
    LATEST_ITERATION_FILE,
    RUN_CONFIG_FILE,
    CheckpointError,
    checkpoint_root,
    iteration_of,
    newest_iteration_dir,
)

# Megatron-Bridge's tracker file and per-iteration files (named once, in config/run_layout.py; train_state.pt only
# here).
TRACKER = LATEST_ITERATION_FILE
RUN_CONFIG = RUN_CONFIG_FILE
TRAIN_STATE = "train_state.pt"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's metadata file (torch_dist and fsdp_dtensor)
MCORE_METADATA = "metadata.json"  # megatron-core's dist_checkpointing config: present exactly for torch_dist


# The run_config.yaml sections kaiyuan reads (others, e.g. `mixed_precision: bf16_mixed`, may be plain values)
SECTIONS_READ = ("model", "train", "checkpoint", "dataset", "tokenizer", "optimizer", "scheduler", "logger", "ddp",
                 "dist", "validation", "rng")


def links_inside(ckpt: Path) -> list[Path]:
    """The symbolic links inside a checkpoint directory (not followed), sorted."""
    found = []
    for folder, dirs, files in os.walk(ckpt):  # does not descend into linked directories
        found += [Path(folder) / n for n in dirs + files if (Path(folder) / n).is_symlink()]
    return sorted(found)


def refuse_links(ckpt: Path) -> None:
    """A checkpoint's files are read from its own directory only: a symbolic link in it (a shard or its metadata
    pointing elsewhere) is refused, naming it, rather than followed."""
    links = links_inside(ckpt)
    if links:
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise CheckpointError(f"{links[0]}: a symbolic link (to {os.readlink(links[0])}) inside the checkpoint{more}; "
                              "its files are read only from the checkpoint directory itself: not followed")


def resolve_checkpoint(path: Path) -> Path:
    """One iter_* directory: as given, or the one a run's tracker names (else its newest)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist")
    if (path / DCP_METADATA).is_file():
        refuse_links(path)
        return path
    if iteration_of(path) is not None:
        raise CheckpointError(f"{path}: no {DCP_METADATA} (not a complete torch_dist / fsdp_dtensor checkpoint: "
                              "still being written, or damaged)")
    root = checkpoint_root(path)
    chosen = newest_iteration_dir(root)
    if chosen is None:
        raise CheckpointError(f"{root}: no iter_* checkpoint directories (expected a run directory, its "
                              "checkpoints/ folder or one iter_* directory)")
    return resolve_checkpoint(chosen)


def read_dcp_metadata(ckpt: Path) -> Any:
    """torch.distributed.checkpoint's Metadata, unpickled with only the classes it is made of (so a crafted
    .metadata runs nothing: compat.restricted_dcp_metadata)."""
    from torch.distributed.checkpoint.metadata import Metadata

    from kaiyuan_recipes.compat import RefusedPickle, restricted_dcp_metadata

    file = Path(ckpt) / DCP_METADATA
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (expected torch.distributed.checkpoint metadata)")
    try:
        metadata = restricted_dcp_metadata(file)
    except RefusedPickle as err:
        raise CheckpointError(f"{file}: refused, not loaded: {err} (a crafted file, or not a checkpoint's "
                              "metadata)") from None
    except Exception as err:  # a truncated or foreign file: unpickling fails in many ways
        raise CheckpointError(f"{file}: unreadable as torch.distributed.checkpoint metadata ({err})") from err
    if not (isinstance(metadata, Metadata) and isinstance(metadata.state_dict_metadata, dict)
            and isinstance(metadata.storage_data, dict)):
        raise CheckpointError(f"{file}: holds a {type(metadata).__name__} without its entries and storage, not "
                              "torch.distributed.checkpoint's Metadata")
    # DCP's FileSystemWriter names its shard files in the checkpoint directory; a path elsewhere is not its.
    outside = sorted({str(getattr(info, "relative_path", None)) for info in metadata.storage_data.values()
                      if not _plain_name(getattr(info, "relative_path", None))})
    if outside:
        raise CheckpointError(f"{file}: places data outside the checkpoint directory ({', '.join(outside[:3])}); "
                              "not read")
    malformed = _malformed_entry(metadata)
    if malformed:
        raise CheckpointError(f"{file}: {malformed} (a crafted or damaged file: not torch.distributed.checkpoint's "
                              "metadata as it writes it)")
    return metadata


def _sizes(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(type(v) is int and v >= 0 for v in value)


def _malformed_entry(metadata: Any) -> str | None:
    """The first entry of a Metadata (made of DCP's classes only) that is not as DCP writes it: every entry a
    tensor's (dtype, size, chunks within it) or an object's, each chunk and object stored, each stored item an
    offset and length in a file. Said in a few words; None when every entry is well formed."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    stored = set()
    for index, info in metadata.storage_data.items():
        if not (isinstance(index, MetadataIndex) and isinstance(index.fqn, str)
                and (index.offset is None or _sizes(index.offset))):
            return f"a storage key {index!r:.80} is not an entry name and offset"
        if not (isinstance(info, _StorageInfo) and type(info.offset) is int and type(info.length) is int
                and info.offset >= 0 and info.length >= 0):
            return f"the storage of {index.fqn} is not an offset and length in a file"
        stored.add((index.fqn, tuple(index.offset or ())))
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(fqn, str):
            return f"an entry named {fqn!r:.80}, not a string"
        if isinstance(entry, BytesStorageMetadata):
            if (fqn, ()) not in stored:
                return f"{fqn}: an object stored nowhere"
            continue
        if not isinstance(entry, TensorStorageMetadata):
            return f"{fqn}: a {type(entry).__name__}, neither a tensor's nor an object's entry"
        if not (isinstance(getattr(entry.properties, "dtype", None), torch.dtype) and _sizes(entry.size)
                and isinstance(entry.chunks, list)):
            return f"{fqn}: a tensor entry without a dtype, a size or its chunks"
        for chunk in entry.chunks:
            if not (isinstance(chunk, ChunkStorageMetadata) and _sizes(chunk.offsets) and _sizes(chunk.sizes)
                    and len(chunk.offsets) == len(chunk.sizes) == len(entry.size)
                    and all(o + n <= s for o, n, s in zip(chunk.offsets, chunk.sizes, entry.size))):
                return f"{fqn}: a chunk that is not a region of its {tuple(entry.size)} tensor"
            if (fqn, tuple(chunk.offsets)) not in stored:
                return f"{fqn}: a chunk at {tuple(chunk.offsets)} stored nowhere"
    return None


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def checkpoint_format(ckpt: Path) -> str:
    """torch_dist when megatron-core's metadata.json says so, else fsdp_dtensor for plain DCP: the rule
    Megatron-Bridge's loader applies (checkpointing._get_checkpoint_format)."""
    config = Path(ckpt) / MCORE_METADATA
    if config.is_file():
        try:
            backend = json.loads(config.read_text()).get("sharded_backend")
        except (ValueError, AttributeError) as err:
            raise CheckpointError(f"{config}: not megatron-core's checkpoint metadata ({one_line(err)})") from err
        return str(backend)
    if (Path(ckpt) / DCP_METADATA).is_file():
        return "fsdp_dtensor"
    raise CheckpointError(f"{ckpt}: neither {MCORE_METADATA} nor {DCP_METADATA} (not a Megatron checkpoint)")


def read_run_config(ckpt: Path) -> dict[str, Any] | None:
    """The ConfigContainer Megatron-Bridge wrote with this save, as plain YAML (None when absent)."""
    import yaml

    file = Path(ckpt) / RUN_CONFIG
    if not file.is_file():
        return None
    try:
        config = yaml.safe_load(file.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not YAML ({one_line(err)})") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: holds a {type(config).__name__}, not Megatron-Bridge's run config")
    for key, value in config.items():  # the sections this package reads: each a mapping or null
        if key in SECTIONS_READ and value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{file}: `{key}` is a {type(value).__name__}, not a section (a mapping) of "
                                  "Megatron-Bridge's run config")
    return config


def read_train_state(ckpt: Path) -> dict[str, Any] | None:
    """Bridge's TrainState of this save (step, consumed samples, FLOPs) as plain numbers; None when absent."""
    import torch

    from kaiyuan_recipes.ckpt.unpickle import describe_failure, weights_only_load

    file = Path(ckpt) / TRAIN_STATE
    if not file.is_file():
        return None
    try:
        state = weights_only_load(file)
    except Exception as err:
        raise CheckpointError(f"{file}: unreadable ({describe_failure(err)})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds a {type(state).__name__}, not Megatron-Bridge's train state")
    return {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v) for k, v in state.items()}


def one_line(err: BaseException) -> str:
    """An error message on one line (YAML's and JSON's span several: the text, a caret, the position)."""
    return " ".join(str(err).split())[:300]


def disk_bytes(path: Path) -> int:
    """The bytes of the files inside `path`, symbolic links not followed."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        sizes = (os.lstat(os.path.join(folder, name)) for name in files)
        total += sum(st.st_size for st in sizes if not stat.S_ISLNK(st.st_mode))
    return total


def section(config: dict[str, Any] | None, name: str) -> dict[str, Any]:
    return ((config or {}).get(name) or {}) if isinstance(config, dict) else {}
