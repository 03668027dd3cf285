"""A NeMo 2 checkpoint's model weights as one safetensors file, the bridge between the two environments (NeMo 2
and Megatron-Bridge cannot share one): Megatron-Bridge's own NeMo 2 route (its tutorial
convert_nemo2_checkpoint_to_bridge) loads the checkpoint with NeMo's `ModelConnector.nemo_load` in the NeMo 2
environment and hands the state dict to the Bridge side. In the NeMo 2 environment:

    python -m kaiyuan_recipes.nemo2.weights RUN_OR_CHECKPOINT_DIR weights.safetensors

then in the Megatron-Bridge one: `kaiyuan export hf weights.safetensors HF_DIR --recipe gpt_smoke`.
This module imports NeMo only inside `dump_weights`: the file format is read and written in both environments."""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

FORMAT = "kaiyuan-nemo2-weights/1"
# The model-config fields recorded beside the weights, checked against the recipe on the Bridge side.
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "qk_layernorm", "share_embeddings_and_output_weights")
# NeMo's LightningModule holds the megatron-core model as `module`.
PREFIX = "module."


def newest_checkpoint(path: Path) -> Path:
    """A NeMo 2 checkpoint directory (context/ + weights/) as is; in a run directory (or its checkpoints/), the
    one of the highest step that has both (NeMo writes context/ with the last save)."""
    path = Path(path)
    if (path / "weights").is_dir() and (path / "context").is_dir():
        return path
    found = [p for p in path.glob("**/checkpoints/*") if (p / "weights").is_dir() and (p / "context").is_dir()]
    found += [p for p in path.glob("*") if (p / "weights").is_dir() and (p / "context").is_dir()]
    if not found:
        raise FileNotFoundError(f"{path}: no NeMo 2 checkpoint (a directory holding context/ and weights/) in it")

    def step(p: Path) -> tuple[int, int]:
        m = re.search(r"step=(\d+)", p.name)
        return (int(m.group(1)) if m else -1, int(p.name.endswith("-last")))

    return max(set(found), key=step)


def is_nemo2_checkpoint(path: Path) -> bool:
    """`path` is, or holds, a checkpoint that `newest_checkpoint` would pick."""
    try:
        newest_checkpoint(path)
    except FileNotFoundError:
        return False
    return True


def save_weights(state: dict[str, Any], meta: dict[str, Any], out: Path) -> Path:
    """Tensors (keys as NeMo names them, `module.` first) and `meta` (JSON) to `out`, through a temporary name."""
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: exists; choose a new output file")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()
               if hasattr(v, "detach") and not k.endswith("_extra_state")}
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": FORMAT, "meta": json.dumps(meta)})
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def load_weights(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors, `module.` removed from their names, and the recorded meta."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    with safe_open(str(path), framework="pt") as fh:
        header = fh.metadata() or {}
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a weights file of kaiyuan_recipes.nemo2.weights (format "
                         f"{header.get('format')!r}, expected {FORMAT!r})")
    state = {k.removeprefix(PREFIX): v for k, v in load_file(str(path)).items()}
    return state, json.loads(header["meta"])


def dump_weights(checkpoint: Path, out: Path) -> Path:
    """Load `checkpoint` (NeMo 2; the newest in a run directory) with NeMo's own loader and save its weights."""
    import torch
    from nemo.lightning.io.connector import ModelConnector

    checkpoint = newest_checkpoint(checkpoint)
    with torch.no_grad():
        model, _ = ModelConnector().nemo_load(checkpoint, cpu=True)
    config = model.config
    meta = {"checkpoint": str(checkpoint), "model_class": type(model).__name__,
            "config": {f: getattr(config, f, None) for f in SHAPE_FIELDS},
            "transformer_layer_spec": getattr(config.transformer_layer_spec, "__name__",
                                              str(config.transformer_layer_spec))}
    return save_weights(model.state_dict(), meta, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaiyuan_recipes.nemo2.weights",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a NeMo 2 checkpoint directory, or the run directory holding it")
    parser.add_argument("out", type=Path, help="the safetensors file to write (must not exist)")
    args = parser.parse_args(argv)
    print(dump_weights(args.checkpoint, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
