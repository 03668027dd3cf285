"""`kaiyuan ckpt diff A B`: tensor by tensor, how far two checkpoints are apart (max |Δ| and ‖A−B‖/‖A‖),
grouped by module and optimizer state, plus the non-tensor state (scheduler, RNG, iteration). The
stop/resume diagnosis: which state differs after the first step of a resumed run. Reads one stored chunk
of A at a time and the same region of B, whatever B's chunking."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaiyuan_recipes.ckpt import regions, store
from kaiyuan_recipes.ckpt.inspect import group_of


@dataclass
class TensorDiff:
    key: str
    group: str
    shape: list[int]
    dtype: str
    equal: bool
    max_abs: float
    rel_norm: float  # ‖A−B‖ / ‖A‖ (‖A−B‖ when A is all zeros)
    note: str | None = None  # why it was not compared (shape or dtype differ)


@dataclass
class ObjectDiff:
    key: str
    equal: bool
    a: str  # repr, cut to 300 characters
    b: str
    changes: list[str] = field(default_factory=list)  # 'path: A -> B' for each differing leaf (the first 20)


@dataclass
class GroupDiff:
    name: str
    keys: int
    differ: int
    missing: int  # in one checkpoint only
    max_abs: float
    rel_norm: float


@dataclass
class DiffReport:
    a: str
    b: str
    identical: bool
    groups: list[GroupDiff]
    tensors: list[TensorDiff]
    objects: list[ObjectDiff]
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)


SLICE = 1 << 22  # elements per fp32 temporary in _Sums.add (16 MiB)


@dataclass
class _Sums:
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    max_abs: float = 0.0

    def add(self, x: Any, y: Any) -> "_Sums":
        """The sums of one stored chunk, a slice at a time: the fp32 temporaries stay SLICE elements long
        whatever the chunk (an embedding chunk of a 2B model is 600 MiB in bf16)."""
        import torch

        part = _Sums()
        xs, ys = x.reshape(-1), y.reshape(-1)
        for start in range(0, xs.numel(), SLICE):
            a = xs[start:start + SLICE].float()
            d = a - ys[start:start + SLICE].float()
            part.merge(_Sums(float(d.square().sum(dtype=torch.float64)), float(a.square().sum(dtype=torch.float64)),
                             float(d.abs().max())))
        self.merge(part)
        return part

    def merge(self, other: "_Sums") -> None:
        self.diff_sq += other.diff_sq
        self.ref_sq += other.ref_sq
        self.max_abs = max(self.max_abs, other.max_abs)

    def rel(self) -> float:
        return math.sqrt(self.diff_sq) / math.sqrt(self.ref_sq) if self.ref_sq else math.sqrt(self.diff_sq)


def _compare_tensor(a: Path, b: Path, md_a: Any, md_b: Any, key: str, sums: _Sums) -> TensorDiff:
    ta, tb = md_a.state_dict_metadata[key], md_b.state_dict_metadata[key]
    dtype = str(ta.properties.dtype).removeprefix("torch.")
    base = dict(key=key, group=group_of(key), shape=list(ta.size), dtype=dtype)
    if ta.size != tb.size or ta.properties.dtype != tb.properties.dtype:
        note = f"A {list(ta.size)} {dtype}, B {list(tb.size)} {str(tb.properties.dtype).removeprefix('torch.')}"
        return TensorDiff(**base, equal=False, max_abs=math.nan, rel_norm=math.nan, note=note)
    import torch

    mine = _Sums()
    equal = True
    for region in regions.stored_regions(key, ta):
        x = regions.load_region(a, region, ta.properties.dtype, md_a)
        y = regions.load_region(b, region, tb.properties.dtype, md_b)  # DCP reshards B to A's chunk
        equal = equal and torch.equal(x, y)
        sums.merge(mine.add(x, y))
    return TensorDiff(**base, equal=equal, max_abs=mine.max_abs, rel_norm=mine.rel())


def leaf_changes(x: Any, y: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where two nested dicts / lists differ ('[0].opt_param_scheduler.num_steps: 12 -> 16'): a whole repr
    hides the one field that moved (the iteration, a scheduler step) among RNG states and param groups."""
    out: list[str] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in list(x) + [k for k in y if k not in x]:
                walk(x.get(k, "<absent>"), y.get(k, "<absent>"), f"{path}.{k}" if path else str(k))
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y) and len(x) <= 64:
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif repr(x) != repr(y):
            out.append(f"{path or '.'}: {repr(x)[:80]} -> {repr(y)[:80]}")

    walk(x, y, path)
    return out


def _compare_object(a: Path, b: Path, md_a: Any, md_b: Any, key: str) -> ObjectDiff:
    x, y = regions.load_object(a, key, md_a), regions.load_object(b, key, md_b)
    ra, rb = repr(x), repr(y)
    return ObjectDiff(key, ra == rb, ra[:300], rb[:300], [] if ra == rb else leaf_changes(x, y))


LEGACY_COMMON_STATE = regions.LEGACY_COMMON_STATE


def _compare_legacy_common_state(a: Path, b: Path) -> ObjectDiff | None:
    """The common state where megatron-core <= 0.18 writes it, beside the DCP files (0.19 stores it inside them as
    common_state/shard_*), read weights-only; None when neither checkpoint has it."""
    if not ((a / LEGACY_COMMON_STATE).is_file() or (b / LEGACY_COMMON_STATE).is_file()):
        return None
    x, y = regions.legacy_common_state(a), regions.legacy_common_state(b)
    ra, rb = repr(x), repr(y)
    return ObjectDiff(LEGACY_COMMON_STATE, ra == rb, ra[:300], rb[:300], [] if ra == rb else leaf_changes(x, y))


def diff_checkpoints(path_a: Path, path_b: Path, show_progress: bool = False) -> DiffReport:
    a, b = store.resolve_checkpoint(path_a), store.resolve_checkpoint(path_b)
    md_a, md_b = store.read_dcp_metadata(a), store.read_dcp_metadata(b)
    tensors_a, tensors_b = regions.tensor_entries(md_a), regions.tensor_entries(md_b)
    objects_a, objects_b = set(regions.bytes_entries(md_a)), set(regions.bytes_entries(md_b))
    keys_a, keys_b = set(tensors_a) | objects_a, set(tensors_b) | objects_b
    stored: dict[str, int] = {}
    for idx, info in md_a.storage_data.items():
        stored[idx.fqn] = stored.get(idx.fqn, 0) + info.length
    groups: dict[str, GroupDiff] = {}
    group_sums: dict[str, _Sums] = {}
    tensor_diffs, object_diffs = [], []
    with regions.read_progress("comparing", show_progress) as bar:
        task = bar.add_task("diff", total=sum(stored.values()))
        for key in sorted(keys_a | keys_b):
            bar.advance(task, stored.get(key, 0))
            name = group_of(key)
            g = groups.setdefault(name, GroupDiff(name, 0, 0, 0, 0.0, 0.0))
            sums = group_sums.setdefault(name, _Sums())
            g.keys += 1
            if key in tensors_a and key in tensors_b:
                d = _compare_tensor(a, b, md_a, md_b, key, sums)
                tensor_diffs.append(d)
                g.differ += not d.equal
            elif key in objects_a and key in objects_b:
                o = _compare_object(a, b, md_a, md_b, key)
                object_diffs.append(o)
                g.differ += not o.equal
            else:  # in one checkpoint only (or a tensor in one, an object in the other)
                g.missing += 1
    legacy = _compare_legacy_common_state(a, b)
    if legacy is not None:
        object_diffs.append(legacy)
        g = groups.setdefault("common_state", GroupDiff("common_state", 0, 0, 0, 0.0, 0.0))
        group_sums.setdefault("common_state", _Sums())
        g.keys += 1
        g.differ += not legacy.equal
    for name, g in groups.items():
        g.max_abs, g.rel_norm = group_sums[name].max_abs, group_sums[name].rel()
    return DiffReport(
        a=str(a), b=str(b), identical=all(g.differ == 0 and g.missing == 0 for g in groups.values()),
        groups=list(groups.values()), tensors=tensor_diffs, objects=object_diffs,
        only_in_a=sorted(keys_a - keys_b), only_in_b=sorted(keys_b - keys_a))
