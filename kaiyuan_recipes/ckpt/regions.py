"""Read a checkpoint one stored chunk at a time, through torch.distributed.checkpoint's own reader and
resharding helper, so memory follows the largest stored chunk (one parameter range of one rank), not the
checkpoint: a 2B model's flat optimizer buckets are gigabytes each, and DCP's default planner would
materialise each whole."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list


@dataclass(frozen=True)
class Region:
    """One rectangular piece of a tensor: what a rank saved (a stored chunk)."""

    fqn: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class _RegionPlanner(LoadPlanner):
    """A LoadPlanner (DCP's extension point) that fills one buffer with one region of one tensor;
    create_read_items_for_chunk_list decides which stored chunks overlap it, as in any reshard."""

    def __init__(self, region: Region, buffer: torch.Tensor) -> None:
        self.region, self.buffer = region, buffer

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        md = self.metadata.state_dict_metadata[self.region.fqn]
        wanted = ChunkStorageMetadata(offsets=torch.Size(self.region.offsets), sizes=torch.Size(self.region.sizes))
        return LoadPlan(create_read_items_for_chunk_list(self.region.fqn, md, [wanted]))

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise AssertionError("a tensor region has no bytes items")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        view = self.buffer
        for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(dim, start, length)
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor handed out a view of the buffer: the data is already in place


def tensor_entries(metadata: Any) -> dict[str, TensorStorageMetadata]:
    return {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def bytes_entries(metadata: Any) -> list[str]:
    return [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]


def stored_regions(fqn: str, md: TensorStorageMetadata) -> list[Region]:
    return [Region(fqn, tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]


def load_region(ckpt: Path, region: Region, dtype: torch.dtype, metadata: Any = None) -> torch.Tensor:
    """The region's values, read from ckpt (any stored chunking: DCP reshards to the region asked for)."""
    import torch.distributed.checkpoint as dcp

    buffer = torch.empty(region.sizes, dtype=dtype)
    reader = _CachedMetadataReader(str(ckpt), metadata)
    with one_process():
        dcp.load({}, storage_reader=reader, planner=_RegionPlanner(region, buffer), no_dist=True)
    return buffer


def load_object(ckpt: Path, fqn: str, metadata: Any = None) -> Any:
    """A bytes entry (a ShardedObject: RNG state, common state, extra state), unpickled by DCP's default
    planner as training's loader does (so: only for checkpoints one would load anyway)."""
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {fqn: io.BytesIO()}
    with one_process():
        dcp.load(state, storage_reader=_CachedMetadataReader(str(ckpt), metadata), no_dist=True)
    return state[fqn]


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """DCP warns on every no_dist load that it assumes one process; here that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def read_progress(label: str, show: bool) -> Any:
    """A rich bar in bytes on stderr (stdout stays for the report / JSON); off when not asked for."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not show, transient=True)


class _CachedMetadataReader(FileSystemReader):
    """DCP's FileSystemReader, handed the Metadata already read (each load would re-read .metadata)."""

    def __init__(self, path: str, metadata: Any = None) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self) -> Any:
        if self._metadata is None:
            self._metadata = super().read_metadata()
        return self._metadata
