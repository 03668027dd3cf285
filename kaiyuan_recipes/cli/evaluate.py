"""`kaiyuan eval heldout`: score HF models on the held-out set (kaiyuan_recipes.eval.heldout_eval)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluation")
    esub = p.add_subparsers(dest="eval_cmd", required=True)
    h = esub.add_parser("heldout", help="NLL / PPL / bits-per-byte and MCQ accuracy per capability dimension")
    h.add_argument("--model", type=Path, action="append", required=True,
                   help="HF model directory or Megatron run/checkpoint (exported first); repeat to compare")
    h.add_argument("--data", type=Path, required=True, help="prompt/completion jsonl (`kaiyuan data heldout`)")
    h.add_argument("--out", type=Path, required=True,
                   help="directory for results.json, results.md and bits_per_byte.png")
    h.add_argument("--max-length", type=int, default=2048,
                   help="tokens per sample; a longer one loses its prompt's start (default 2048)")
    h.add_argument("--batch-size", type=int, default=8, help="samples scored at once (default 8)")
    h.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1 (default cpu)")
    h.add_argument("--allow-skipped", type=int, default=0, metavar="N",
                   help="score the usable lines when at most N lines are unusable (default 0: any is an error)")
    h.set_defaults(func=heldout)


def heldout(args: Any) -> int:
    if not args.data.is_file():
        raise FileNotFoundError(f"--data {args.data}: no such file")
    from kaiyuan_recipes.eval.heldout_eval import evaluate_models, markdown_table

    if args.allow_skipped < 0:
        raise ValueError(f"--allow-skipped {args.allow_skipped}: expected 0 or more lines")
    report = evaluate_models(args.model, args.data, args.out, args.max_length, args.device, args.batch_size,
                             allow_skipped=args.allow_skipped)
    print(markdown_table(report["results"]))
    if report["skipped"]:
        print(f"skipped {report['skipped']} line(s): " + "; ".join(report["problems"][:10]), file=sys.stderr)
    return 0
