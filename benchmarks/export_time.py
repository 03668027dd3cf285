"""Export time of `kaiyuan export hf` on this (CPU) host for a recipe's full-size model: a random-weight
bf16 checkpoint is written with Megatron-Bridge's torch_dist writer, then exported by the CLI's code path,
timed end to end (checkpoint read, conversion, sharded safetensors written and renamed).

usage: python benchmarks/export_time.py qwen3_1p7b --work /tmp/export_time --out export_time.json"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance, this_command, write_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir, tokenizer_vocab_size
    from kaiyuan_recipes.export.hf_to_megatron import build_cpu_model
    from kaiyuan_recipes.export.megatron_to_hf import bridge_for, ensure_single_process_group, export_hf
    from kaiyuan_recipes.models.shape import ModelShape

    shutil.rmtree(args.work, ignore_errors=True)
    ensure_single_process_group()
    shape = ModelShape.for_recipe(args.recipe)
    model = build_cpu_model(shape, torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    bridge_for(shape, tokenizer_vocab_size(default_tokenizer_dir())).save_megatron_model(
        [model], args.work / "megatron")
    write_s = time.perf_counter() - start
    del model
    start = time.perf_counter()
    out = export_hf(args.work / "megatron", args.work / "hf", None, default_tokenizer_dir(), show_progress=False)
    export_s = time.perf_counter() - start
    size = sum(f.stat().st_size for f in out.iterdir())
    result = {**provenance(this_command()), "recipe": args.recipe, "parameters": params,
              "checkpoint_write_s": write_s, "export_s": export_s, "hf_bytes": size, "target_s": 60,
              "within_target": export_s < 60}
    write_json(args.out, result)
    print(result)


if __name__ == "__main__":
    main()
