"""The kernel settings each Megatron row of train_throughput.py builds (training/metrics.py's kernel_settings: the
model's kernel fields and kaiyuan's fast-path pieces), from the recipe's own build_config, and which rows build the
same: a row that trains what another row trains needs no GPU time of its own. The run's train_start record stays
the account of what did train. TE's rows build only where Transformer Engine imports.

usage: python benchmarks/row_settings.py --models qwen3_1p7b gpt_smoke --impls recipe_te megatron_te [--out F]
       (the JSON on stdout, or into --out; Megatron's logging goes to stderr)"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from megatron_rows import BATCH, megatron_overrides  # noqa: E402
from train_throughput import MEGATRON_IMPLS  # noqa: E402


def row_overrides(model: str, impl: str, seq: int = 4096, steps: int = 15) -> list[str]:
    """The overrides train_throughput passes for this row (its defaults: --seq 4096, --steps 15)."""
    spec, extra = MEGATRON_IMPLS[impl]
    mbs, micro = BATCH[model]
    return megatron_overrides(spec, mbs, micro, seq, steps, Path("/tmp/row-settings"), extra=extra)


def settings(model: str, impl: str) -> dict:
    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.metrics import kernel_settings

    cfg, run = build_config(model, row_overrides(model, impl))
    return {**kernel_settings(cfg.model, run.fastpath), "layer_spec": run.layer_spec}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["qwen3_1p7b", "gpt_smoke"])
    ap.add_argument("--impls", nargs="+", required=True, choices=list(MEGATRON_IMPLS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, force=True)  # stdout is the JSON
    result = {}
    for model in args.models:
        rows = {impl: settings(model, impl) for impl in args.impls}
        same = [[a, b] for i, a in enumerate(args.impls) for b in args.impls[i + 1:] if rows[a] == rows[b]]
        result[model] = {"settings": rows, "same_settings": same}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
