"""The pickles inside a checkpoint besides DCP's .metadata (train_state.pt, megatron-core's ShardedObjects and
common state), loaded with torch's weights-only unpickler: a checkpoint someone handed over runs no code when a
`kaiyuan ckpt` command or `kaiyuan average` reads it."""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any


def weights_only_load(data: io.BytesIO | Path) -> Any:
    """torch.load(weights_only=True), allowing the classes megatron-core's own checkpoint objects hold (its
    SAFE_GLOBALS: RNG states' numpy arrays, argparse.Namespace, its enums and OptimizerConfig)."""
    import torch
    from megatron.core.safe_globals import SAFE_GLOBALS

    with torch.serialization.safe_globals(SAFE_GLOBALS):
        return torch.load(data, map_location="cpu", weights_only=True)


_REFUSED_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)")


def describe_failure(err: BaseException) -> str:
    """One line for why a stored entry did not load: refused (its pickle names code to run), garbled, or the
    error's first line."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException) and err.failures:  # DCP's per-rank wrapper
        err = next(iter(err.failures.values()))[0]  # (exception, traceback)
    if isinstance(err, pickle.UnpicklingError):
        refused = _REFUSED_GLOBAL.search(str(err))
        if refused:
            return (f"refused: its pickle names {refused.group(1)}, which no megatron-core checkpoint holds; "
                    "not loaded")
        return "its stored bytes do not unpickle: garbled data"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"
