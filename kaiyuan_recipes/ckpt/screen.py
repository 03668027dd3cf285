"""Before a checkpoint goes to upstream's loaders (megatron-core's dist_checkpointing.load under Megatron-Bridge's
load_megatron_model, which `kaiyuan average` and `kaiyuan export hf` call): every pickle those loaders open is read
here first without running code, and a checkpoint with anything else in it is refused, naming the file.

Upstream unpickles DCP's .metadata with plain pickle and the bytes entries with torch.load(weights_only=False). Once
the same bytes have passed the restricted readers, they name only allowlisted classes, so upstream's unpickling of
them builds those and nothing else (the files are read again by upstream: a checkpoint being rewritten while it is
loaded is outside what this check covers)."""

from __future__ import annotations

from pathlib import Path

from kaiyuan_recipes.ckpt import regions, store


def screen_pickles(ckpt: Path) -> None:
    """.metadata (restricted unpickler), every bytes entry and common.pt (weights-only), train_state.pt
    (weights-only): raises store.CheckpointError naming the first file that does not pass."""
    ckpt = Path(ckpt)
    metadata = store.read_dcp_metadata(ckpt)
    for fqn in regions.bytes_entries(metadata):
        regions.load_object(ckpt, fqn, metadata)
    regions.legacy_common_state(ckpt)
    store.read_train_state(ckpt)
