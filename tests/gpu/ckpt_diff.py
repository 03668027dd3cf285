"""Compare two checkpoints tensor by tensor (the stop/resume diagnosis of tests/gpu/resume_diag.sh): one JSON
line per group of keys, the whole report with --out. The work is `kaiyuan ckpt diff` (kaiyuan_recipes.ckpt.diff);
this keeps the script's usage and output for resume_diag.sh, and exits 0 whether or not they differ.

usage: python tests/gpu/ckpt_diff.py ITER_DIR_A ITER_DIR_B [--out FILE]"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from kaiyuan_recipes.ckpt.diff import diff_checkpoints


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    report = diff_checkpoints(args.a, args.b)
    for group in report.groups:
        fields = dataclasses.asdict(group)
        print(json.dumps({fields.pop("name"): fields}))
    for obj in report.objects:
        if not obj.equal:
            print(json.dumps({obj.key: {"a": obj.a, "b": obj.b}}))
    if args.out:
        args.out.write_text(json.dumps(dataclasses.asdict(report), indent=2))


if __name__ == "__main__":
    main()
