"""`kaiyuan export hf`: a run's Megatron checkpoint → a Hugging Face directory (kaiyuan_exporters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="export checkpoints")
    esub = p.add_subparsers(dest="export_cmd", required=True)
    hf = esub.add_parser("hf", help="Megatron torch_dist checkpoint -> Hugging Face directory")
    hf.add_argument("checkpoint", type=Path, help="a run directory, its checkpoints/ or an iter_* directory")
    hf.add_argument("out", type=Path)
    hf.add_argument("--recipe", required=True, help="the recipe the checkpoint was trained with (its model.yaml)")
    hf.add_argument("--tokenizer", type=Path, help="tokenizer directory to ship (default: the bundled one)")
    hf.set_defaults(func=export_hf)


def export_hf(args: Any) -> int:
    from kaiyuan_exporters.megatron_to_hf import export_hf as run_export
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.recipe_tree import load_model_file

    out = run_export(args.checkpoint, args.out, load_model_file(args.recipe), args.tokenizer or default_tokenizer_dir())
    print(out)
    return 0
