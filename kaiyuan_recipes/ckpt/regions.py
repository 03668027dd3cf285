"""Read a checkpoint one stored chunk at a time, through torch.distributed.checkpoint's own reader and
resharding helper, so memory follows the largest stored chunk (one parameter range of one rank), not the
checkpoint: a 2B model's flat optimizer buckets are gigabytes each, and DCP's default planner would
materialise each whole.

Nothing read here runs code from the checkpoint: the metadata comes through store.read_dcp_metadata (a restricted
unpickler), and bytes entries through torch.load(weights_only=True) with megatron-core's own allowlist, where DCP's
default planner would unpickle them with weights_only=False."""

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
from torch.distributed.checkpoint.api import CheckpointException  # DCP's wrapper: a BaseException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from kaiyuan_recipes.ckpt import store
from kaiyuan_recipes.ckpt.unpickle import describe_failure, weights_only_load


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


class _WeightsOnlyObjectPlanner(DefaultLoadPlanner):
    """DCP's default planner, with bytes entries unpickled by torch's weights-only unpickler into `loaded`."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, Any] = {}

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.loaded[read_item.dest_index.fqn] = weights_only_load(value)


class ReadError(store.CheckpointError):
    """An entry that does not load; `files` are the shard files that hold it (the ones to look at)."""

    def __init__(self, ckpt: Path, fqn: str, files: list[str], reason: str) -> None:
        self.ckpt, self.fqn, self.files, self.reason = Path(ckpt), fqn, files, reason
        named = ", ".join(str(self.ckpt / f) for f in files) or str(self.ckpt)
        super().__init__(f"{named}: {fqn}: does not load ({reason})")


def files_of(metadata: Any, fqn: str) -> list[str]:
    """The shard files that hold an entry's stored pieces."""
    return sorted({info.relative_path for idx, info in metadata.storage_data.items() if idx.fqn == fqn})


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
    try:
        with one_process():
            dcp.load({}, storage_reader=reader, planner=_RegionPlanner(region, buffer), no_dist=True)
    except (Exception, CheckpointException) as err:  # DCP's wrapper is a BaseException
        raise ReadError(ckpt, region.fqn, files_of(reader.read_metadata(), region.fqn), describe_failure(err)) from err
    return buffer


def load_object(ckpt: Path, fqn: str, metadata: Any = None) -> Any:
    """A bytes entry (a ShardedObject: RNG state, common state, extra state), unpickled weights-only."""
    import torch.distributed.checkpoint as dcp

    reader, planner = _CachedMetadataReader(str(ckpt), metadata), _WeightsOnlyObjectPlanner()
    try:
        with one_process():
            dcp.load({fqn: io.BytesIO()}, storage_reader=reader, planner=planner, no_dist=True)
        return planner.loaded[fqn]
    except (Exception, CheckpointException) as err:
        raise ReadError(ckpt, fqn, files_of(reader.read_metadata(), fqn), describe_failure(err)) from err


LEGACY_COMMON_STATE = "common.pt"  # megatron-core <= 0.18 keeps the common state (iteration, scheduler) here


def legacy_common_state(ckpt: Path) -> Any:
    """common.pt beside the DCP files (megatron-core <= 0.18), weights-only; None when absent."""
    file = Path(ckpt) / LEGACY_COMMON_STATE
    if not file.is_file():
        return None
    try:
        return weights_only_load(file)
    except Exception as err:
        raise store.CheckpointError(f"{file}: does not load ({describe_failure(err)})") from err


def common_state(ckpt: Path, metadata: Any) -> dict[str, Any] | None:
    """megatron-core's common state (iteration, scheduler, content metadata): what its load_common_state_dict
    returns, read weights-only (its own reader unpickles the ShardedObject with DCP's default planner)."""
    state = legacy_common_state(ckpt)
    if state is None:
        key = next((k for k in bytes_entries(metadata) if k.split("/", 1)[0] == "common_state"), None)
        if key is None:
            return None
        state = load_object(ckpt, key, metadata)
        state = state[0] if isinstance(state, list) and state else state  # a ShardedObject holds [state]
    return state if isinstance(state, dict) else None


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
    """DCP's FileSystemReader, handed the Metadata already read (each load would re-read .metadata), which
    reads it, when not handed, with the restricted unpickler (its own read_metadata is a plain pickle.load)."""

    def __init__(self, path: str, metadata: Any = None) -> None:
        super().__init__(path)
        self._ckpt, self._metadata = Path(path), metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self._metadata is None:
            self._metadata = store.read_dcp_metadata(self._ckpt)
        if getattr(self._metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata
