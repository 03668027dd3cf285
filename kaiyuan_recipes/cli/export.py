"""`kaiyuan export hf|megatron`: Megatron torch_dist checkpoints ↔ Hugging Face directories
(kaiyuan_recipes.export)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="convert checkpoints between Megatron and Hugging Face")
    esub = p.add_subparsers(dest="export_cmd", required=True)
    hf = esub.add_parser("hf", help="Megatron torch_dist checkpoint (or a NeMo 2 one's weights) -> "
                                    "Hugging Face directory")
    hf.add_argument("checkpoint", type=Path, help="a run directory, its checkpoints/ or an iter_* directory; or the "
                    ".safetensors file of a NeMo 2 checkpoint's weights (python -m kaiyuan_recipes.nemo2.weights, in "
                    "the NeMo 2 environment), with --recipe")
    hf.add_argument("out", type=Path, help="the new Hugging Face directory (must not exist)")
    hf.add_argument("--recipe",
                    help="the recipe whose model.yaml the checkpoint has (default: the shape recorded in the "
                         "checkpoint; a recipe of another shape is refused)")
    hf.add_argument("--tokenizer", type=Path,
                    help="tokenizer directory to ship (default: the run's, else the bundled one)")
    hf.set_defaults(func=export_hf)
    mg = esub.add_parser("megatron", help="Hugging Face directory -> Megatron torch_dist checkpoint "
                                          "(continue training with checkpoint.pretrained_checkpoint=OUT)")
    mg.add_argument("hf_dir", type=Path, help="a Hugging Face model directory (config.json, safetensors)")
    mg.add_argument("out", type=Path, help="the new checkpoint directory (must not exist)")
    mg.add_argument("--recipe", required=True, help="the recipe whose model.yaml the weights fit")
    mg.set_defaults(func=export_megatron)


def export_hf(args: Any) -> int:
    import time

    from kaiyuan_recipes.atomic import require_new_output

    start = time.perf_counter()
    require_new_output(args.out)
    if not args.checkpoint.exists():
        raise FileNotFoundError(f"{args.checkpoint}: no such file or directory")
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir
    from kaiyuan_recipes.export.megatron_to_hf import export_hf as run_export
    from kaiyuan_recipes.export.megatron_to_hf import trained_tokenizer_dir
    from kaiyuan_recipes.models.shape import ModelShape

    shape = ModelShape.for_recipe(args.recipe) if args.recipe else None
    checkpoint = Path(args.checkpoint)
    # default: what the run trained with (its run_config.yaml), else the bundled one
    tokenizer = args.tokenizer or (trained_tokenizer_dir(checkpoint) if checkpoint.is_dir()
                                   else default_tokenizer_dir())
    from kaiyuan_recipes.nemo2.weights import is_nemo2_checkpoint

    if checkpoint.is_dir() and is_nemo2_checkpoint(checkpoint):
        raise SystemExit(f"{checkpoint}: a NeMo 2 checkpoint; dump its weights in the NeMo 2 environment first "
                         f"(python -m kaiyuan_recipes.nemo2.weights {checkpoint} weights.safetensors), then "
                         "kaiyuan export hf weights.safetensors OUT --recipe RECIPE")
    if checkpoint.suffix == ".safetensors":
        from kaiyuan_recipes.export.nemo2_to_hf import export_nemo2_hf

        if shape is None:
            raise SystemExit(f"{checkpoint}: NeMo 2 weights carry no recipe; pass --recipe (e.g. --recipe gpt_smoke)")
        out = export_nemo2_hf(checkpoint, args.out, shape, tokenizer)
    else:
        out = run_export(checkpoint, args.out, shape, tokenizer)
    print(f"{out}  ({time.perf_counter() - start:.1f} s)")
    return 0


def export_megatron(args: Any) -> int:
    from kaiyuan_recipes.export.hf_to_megatron import import_hf
    from kaiyuan_recipes.models.shape import ModelShape

    print(import_hf(args.hf_dir, args.out, ModelShape.for_recipe(args.recipe)))
    return 0
