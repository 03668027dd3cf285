"""`kaiyuan ckpt ls`: every saved iteration of a run, what it holds, and which one the next save's
keep-last-K cleanup deletes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from kaiyuan_recipes.ckpt import store
from kaiyuan_recipes.config.run_layout import checkpoint_root, iteration_dirs, tracker_iteration


@dataclass
class CheckpointEntry:
    iteration: int
    path: str
    complete: bool  # .metadata written: a save still in flight (or killed) has none
    format: str | None
    disk_bytes: int
    saved_at: str | None  # UTC, from the files Bridge writes last
    consumed_samples: int | None
    consumed_tokens: int | None
    has_optimizer: bool | None
    latest: bool  # the one latest_checkpointed_iteration.txt names (what a resume loads)
    deleted_next: bool  # removed by keep-last-K when the next checkpoint is saved


@dataclass
class RunListing:
    root: str
    tracker_iteration: int | None
    most_recent_k: int | None  # checkpoint.most_recent_k of the newest run_config.yaml; -1 keeps all
    checkpoints: list[CheckpointEntry]
    deleted_next: list[int]
    notes: list[str] = field(default_factory=list)


def deleted_by_next_save(iterations: list[int], most_recent_k: int | None) -> list[int]:
    """Megatron-Bridge's rule (checkpointing.cleanup_old_non_persistent_checkpoint, run after each save
    when most_recent_k > -1): sort iter_* by number and keep the newest K. The next save adds one newer
    iteration, so of today's it deletes all but the newest K-1 (K=0: every one)."""
    if most_recent_k is None or most_recent_k < 0:
        return []
    after_next = sorted(iterations) + [None]  # None: the save to come, newer than all
    removed = after_next[:-most_recent_k] if most_recent_k > 0 else after_next
    return [it for it in removed if it is not None]


def _saved_at(ckpt: Path) -> str | None:
    # train_state.pt is written after the tensor data is finalised; .metadata when DCP finishes.
    for name in (store.TRAIN_STATE, store.DCP_METADATA):
        if (ckpt / name).is_file():
            stamp = dt.datetime.fromtimestamp((ckpt / name).stat().st_mtime, tz=dt.timezone.utc)
            return stamp.isoformat(timespec="seconds")
    return None


def _entry(ckpt: Path, latest: int | None) -> CheckpointEntry:
    iteration = store.iteration_of(ckpt)
    complete = (ckpt / store.DCP_METADATA).is_file()
    fmt = has_optimizer = None
    if complete:
        store.refuse_links(ckpt)
        fmt = store.checkpoint_format(ckpt)
        keys = store.read_dcp_metadata(ckpt).state_dict_metadata
        has_optimizer = any(k.startswith("optimizer.") for k in keys)
    state = store.read_train_state(ckpt) or {}
    samples = state.get("consumed_train_samples")
    dataset = store.section(store.read_run_config(ckpt), "dataset")
    seq = dataset.get("seq_length") or dataset.get("sequence_length")  # megatron-bridge 0.5 writes the latter
    return CheckpointEntry(
        iteration=iteration, path=str(ckpt), complete=complete, format=fmt, disk_bytes=store.disk_bytes(ckpt),
        saved_at=_saved_at(ckpt), consumed_samples=None if samples is None else int(samples),
        consumed_tokens=int(samples) * int(seq) if samples is not None and seq else None,
        has_optimizer=has_optimizer, latest=iteration == latest, deleted_next=False)


def list_checkpoints(run: Path) -> RunListing:
    root = checkpoint_root(run)
    dirs = iteration_dirs(root)
    if not dirs:
        raise store.CheckpointError(f"{root}: no iter_* checkpoint directories (expected a run directory or "
                                    "its checkpoints/ folder with at least one save)")
    latest = tracker_iteration(root)
    entries = [_entry(d, latest) for d in dirs]
    notes = []
    newest_config = next((store.read_run_config(d) for d in reversed(dirs) if (d / store.RUN_CONFIG).is_file()), None)
    k = store.section(newest_config, "checkpoint").get("most_recent_k")
    if newest_config is None:
        notes.append(f"no {store.RUN_CONFIG} in any checkpoint: keep-last-K unknown")
    if latest is None:
        notes.append(f"{root / store.TRACKER}: missing; a resume starts from scratch")
    elif not any(e.iteration == latest for e in entries):
        notes.append(f"{root / store.TRACKER} names iteration {latest}, which has no directory; a resume fails")
    for e in entries:
        if not e.complete:
            notes.append(f"{e.path}: no {store.DCP_METADATA} (a save in flight, or one killed mid-write)")
    # Bridge's cleanup counts every iter_* directory, complete or not.
    doomed = deleted_by_next_save([e.iteration for e in entries], k)
    for e in entries:
        e.deleted_next = e.iteration in doomed
    return RunListing(root=str(root), tracker_iteration=latest, most_recent_k=k, checkpoints=entries,
                      deleted_next=doomed, notes=notes)
