"""Compare two torch_dist checkpoints tensor by tensor (the stop/resume diagnosis: which state differs
after the first optimizer step of a resumed run). Prints one JSON line per group of keys.

usage: python tests/gpu/ckpt_diff.py ITER_DIR_A ITER_DIR_B [--out FILE]"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict


def load(path: Path) -> dict:
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return state


def group_of(key: str) -> str:
    """'optimizer.distributed...param' -> optimizer.param; model weights -> model; else the key."""
    if key.startswith("optimizer."):
        return "optimizer." + key.rsplit(".", 1)[-1]
    return "model" if re.search(r"(weight|bias)$", key) else key


def compare(a: dict, b: dict) -> dict:
    groups: dict[str, dict] = {}
    for key in sorted(set(a) | set(b)):
        g = groups.setdefault(group_of(key), {"keys": 0, "differ": 0, "max_abs": 0.0, "missing": 0})
        g["keys"] += 1
        if key not in a or key not in b:
            g["missing"] += 1
            continue
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not torch.equal(x, y):
                g["differ"] += 1
                g["max_abs"] = max(g["max_abs"], (x.float() - y.float()).abs().max().item())
        elif repr(x) != repr(y):
            g["differ"] += 1
            g.setdefault("values", []).append([key, repr(x)[:300], repr(y)[:300]])
    return groups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"a": str(args.a), "b": str(args.b), "groups": compare(load(args.a), load(args.b))}
    for name, g in result["groups"].items():
        print(json.dumps({name: g}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
