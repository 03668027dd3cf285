"""`kaiyuan ckpt verify`: every shard file the metadata names is present and of the size its items need,
and every tensor and object loads (one stored chunk at a time). DCP keeps no checksums: flipped bits inside
a chunk that still unpickles are not detected, but a missing, truncated or garbled file is. Objects are unpickled
weights-only: one whose pickle names code to run is reported as refused, and nothing in it runs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaiyuan_recipes.ckpt import regions, store


@dataclass
class ShardFile:
    name: str
    items: int
    expected_bytes: int  # the end of its last item, as the metadata records the items
    actual_bytes: int | None  # None: missing


@dataclass
class Problem:
    file: str  # the path to look at
    what: str


@dataclass
class VerifyReport:
    path: str
    format: str
    files: list[ShardFile]
    tensors_checked: int
    objects_checked: int
    bytes_read: int
    problems: list[Problem]
    nonfinite: list[str] = field(default_factory=list)  # tensors with NaN / Inf (loadable, but suspect)
    ok: bool = False  # no problems

    def __post_init__(self) -> None:
        self.ok = not self.problems


def shard_files(ckpt: Path, metadata: Any) -> list[ShardFile]:
    items: dict[str, int] = defaultdict(int)
    ends: dict[str, int] = defaultdict(int)
    for info in metadata.storage_data.values():
        items[info.relative_path] += 1
        ends[info.relative_path] = max(ends[info.relative_path], info.offset + info.length)
    files = []
    for name in sorted(ends):
        path = ckpt / name
        files.append(ShardFile(name, items[name], ends[name], path.stat().st_size if path.is_file() else None))
    return files


def file_problems(ckpt: Path, files: list[ShardFile]) -> list[Problem]:
    problems = []
    for f in files:
        path = str(ckpt / f.name)
        if f.actual_bytes is None:
            problems.append(Problem(path, f"missing (the metadata places {f.items} items in it)"))
        elif f.actual_bytes < f.expected_bytes:
            problems.append(Problem(path, f"truncated: {f.actual_bytes:,} bytes, its items need {f.expected_bytes:,}"))
        else:
            try:
                with open(path, "rb") as fh:
                    fh.read(1)
            except OSError as err:
                problems.append(Problem(path, f"unreadable ({err})"))
    return problems


def verify_checkpoint(path: Path, show_progress: bool = False) -> VerifyReport:
    import torch

    ckpt = store.resolve_checkpoint(path)
    fmt = store.checkpoint_format(ckpt)
    metadata = store.read_dcp_metadata(ckpt)
    files = shard_files(ckpt, metadata)
    problems = file_problems(ckpt, files)
    bad_files = {Path(p.file).name for p in problems}
    readers = {store.TRAIN_STATE: store.read_train_state, store.RUN_CONFIG: store.read_run_config,
               regions.LEGACY_COMMON_STATE: regions.legacy_common_state}
    for name, read in readers.items():
        try:
            read(ckpt)
        except store.CheckpointError as err:
            problems.append(Problem(str(ckpt / name), str(err).removeprefix(f"{ckpt / name}: ")))

    tensors = regions.tensor_entries(metadata)
    objects = regions.bytes_entries(metadata)
    # Each stored item lives in one file: a failed chunk names exactly that file.
    file_of = {(idx.fqn, tuple(idx.offset or ())): info.relative_path for idx, info in metadata.storage_data.items()}
    bytes_of: dict[str, int] = defaultdict(int)
    for idx, info in metadata.storage_data.items():
        bytes_of[idx.fqn] += info.length
    done = read = checked_t = checked_o = 0
    nonfinite = []
    with regions.read_progress("verifying", show_progress) as bar:
        task = bar.add_task("read", total=sum(bytes_of.values()))
        for fqn in list(tensors) + objects:
            done += bytes_of[fqn]
            pieces = ([(r, file_of[(fqn, r.offsets)]) for r in regions.stored_regions(fqn, tensors[fqn])]
                      if fqn in tensors else [(None, file_of[(fqn, ())])])
            finite = loaded = True
            for region, name in pieces:
                if name in bad_files:
                    loaded = False  # its file is already reported
                    break
                try:
                    if region is None:
                        regions.load_object(ckpt, fqn, metadata)
                    else:
                        value = regions.load_region(ckpt, region, tensors[fqn].properties.dtype, metadata)
                        finite = finite and (not value.is_floating_point() or bool(torch.isfinite(value).all()))
                except regions.ReadError as err:
                    problems.append(Problem(str(ckpt / name), f"{fqn}: does not load ({err.reason})"))
                    bad_files.add(name)
                    loaded = False
                    break
            if loaded:
                read += bytes_of[fqn]
                checked_t += region is not None
                checked_o += region is None
                if not finite:
                    nonfinite.append(fqn)
            bar.update(task, completed=done)
    return VerifyReport(str(ckpt), fmt, files, checked_t, checked_o, read, problems, nonfinite)
