"""Workarounds for PyTorch's distributed checkpoint (torch.distributed.checkpoint, DCP)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

# What DCP's Metadata pickle holds (torch/distributed/checkpoint/metadata.py, its FileSystemWriter's _StorageInfo,
# and the save plans megatron-core's writer keeps in it): plain dataclasses and enums that run nothing when built.
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch.distributed.checkpoint.planner": ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData",
                                             "BytesIOWriteData"),
    "torch": ("Size",),
    "torch.serialization": ("_get_layout",),  # how torch.layout pickles: a lookup by name
    "collections": ("OrderedDict",),
}


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that names something outside the allowlist; it was not loaded (nothing it names ran)."""


class _DcpMetadataUnpickler(pickle.Unpickler):
    """pickle's own Unpickler with find_class restricted to _DCP_CLASSES and torch's dtypes (the pattern the pickle
    documentation gives for restricting globals). Every callable a pickle can reach goes through find_class."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise RefusedPickle(f"it names {module}.{name}, which torch.distributed.checkpoint's metadata never holds")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("it references external storage, which torch.distributed.checkpoint's metadata never does")


def restricted_dcp_metadata(file: Path) -> Any:
    """DCP's .metadata, unpickled with only the classes DCP's Metadata is made of.

    FileSystemReader.read_metadata (torch 2.14.1) reads this file with plain pickle.load: a crafted .metadata runs
    any code on `kaiyuan ckpt ls`. torch.load(weights_only=True) cannot stand in: its unpickler reads the protocol-2
    opcodes torch.save writes, and DCP pickles .metadata with the default protocol (4+: FRAME, MEMOIZE,
    STACK_GLOBAL), which it refuses as 'Unsupported operand'. Raises RefusedPickle for anything off the list."""
    with open(file, "rb") as fh:
        return _DcpMetadataUnpickler(fh).load()
