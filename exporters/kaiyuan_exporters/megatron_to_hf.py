"""Megatron torch_dist checkpoint → Hugging Face directory (and back), through Megatron-Bridge's
AutoBridge, on the CPU, with no hub access. The output is written to a temporary directory and
renamed when complete: an interrupted export leaves no half-written output."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from kaiyuan_exporters.hf_config import hf_config_for
from kaiyuan_recipes import compat
from kaiyuan_recipes.data.tokenizer import tokenizer_vocab_size

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")


def ensure_single_process_group() -> None:
    """AutoBridge's loaders are collectives; a CPU export is one gloo process."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()


def checkpoint_root(path: Path) -> Path:
    """A run directory, its checkpoints/ directory, or one iter_* directory."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    if not (path.name.startswith("iter_") or any(p.name.startswith("iter_") for p in path.iterdir())):
        raise FileNotFoundError(f"{path}: no iter_* checkpoint directories")
    return path


def bridge_for(shape: dict[str, Any], tokenizer_vocab: int | None = None):
    compat.import_megatron_bridge()
    from megatron.bridge import AutoBridge

    return AutoBridge.from_hf_config(hf_config_for(shape, tokenizer_vocab))


def export_hf(checkpoint: Path, out: Path, shape: dict[str, Any], tokenizer_dir: Path | None = None,
              show_progress: bool = True) -> Path:
    """Load the newest torch_dist checkpoint under `checkpoint` and write it as a HF directory."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: exists; choose a new output directory")
    ensure_single_process_group()
    bridge = bridge_for(shape, tokenizer_vocab_size(tokenizer_dir) if tokenizer_dir else None)
    model = bridge.load_megatron_model(str(checkpoint_root(checkpoint)), wrap_with_ddp=False)
    return write_hf_dir(bridge, model, out, tokenizer_dir, show_progress)


def write_hf_dir(bridge: Any, model: Any, out: Path, tokenizer_dir: Path | None = None, show_progress: bool = True) -> Path:
    """Weights (sharded safetensors), config, tokenizer files and generation_config, written to a
    temporary directory that is renamed to `out` only when complete."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: exists; choose a new output directory")
    models = model if isinstance(model, list) else [model]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        bridge.save_hf_pretrained(models, tmp, show_progress=show_progress)
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        from transformers import GenerationConfig

        GenerationConfig(eos_token_id=151643, pad_token_id=151643, do_sample=False).save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
