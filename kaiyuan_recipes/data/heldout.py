"""The held-out validation set: 7 capability dimensions × 400 samples from a jsonl of
{"dimension", "prompt", "completion", optional "choices" and "answer"}. Produces (a) a packed-text
Megatron prefix for in-training validation loss and (b) a prompt/completion jsonl for the evaluator."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.jsonl import read_jsonl_objects

DIMENSIONS = ("science_reasoning", "logic", "code", "chinese_exam", "math", "chinese_dialogue", "english_dialogue")
PER_DIMENSION = 400


class HeldoutError(ValueError):
    pass


def sample_problems(row: dict[str, Any]) -> list[str]:
    """What is wrong with one held-out sample: the one check that `kaiyuan data heldout` and `kaiyuan eval heldout`
    both apply, so a file the first accepts is one the second scores."""
    problems = [f"'{key}' missing or empty" for key in ("prompt", "completion")
                if not isinstance(row.get(key), str) or not row[key]]
    if "choices" in row or "answer" in row:
        choices, answer = row.get("choices"), row.get("answer")
        if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) and c for c in choices)):
            problems.append("'choices' must be a list of 2 or more non-empty strings")
        elif type(answer) is not int or not 0 <= answer < len(choices):
            problems.append(f"'answer' must be an integer index of the choices (0..{len(choices) - 1}), got {answer!r}")
    return problems


def read_heldout(path: Path, per_dimension: int = PER_DIMENSION) -> list[dict[str, Any]]:
    """Every line checked; all problems reported together with their line numbers."""
    path = Path(path)
    rows, problems = [], []
    for lineno, row, problem in read_jsonl_objects(path):
        if row is None:
            problems.append(problem)
            continue
        if row.get("dimension") not in DIMENSIONS:
            problems.append(f"line {lineno}: dimension {row.get('dimension')!r} not one of {', '.join(DIMENSIONS)}")
        problems += [f"line {lineno}: {p}" for p in sample_problems(row)]
        rows.append(row)
    if not rows and not problems:
        problems.append("the file holds no samples")
    counts = Counter(r.get("dimension") for r in rows)
    for dim in DIMENSIONS:
        if counts.get(dim, 0) != per_dimension:
            problems.append(f"dimension {dim!r}: {counts.get(dim, 0)} samples, expected {per_dimension} "
                            "(--per-dimension)")
    if problems:
        shown = "; ".join(problems[:10]) + (f"; … {len(problems) - 10} more" if len(problems) > 10 else "")
        raise HeldoutError(f"{path}: {len(problems)} problem(s): {shown}")
    return rows


def write_heldout(
    path: Path, output_dir: Path, tokenizer_dir: Path, per_dimension: int = PER_DIMENSION
) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory

    rows = read_heldout(path, per_dimension)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # (b) prompt/completion, for `kaiyuan eval heldout`
    pc_path = output_dir / "heldout_prompt_completion.jsonl"
    fd, tmp = tempfile.mkstemp(dir=output_dir, prefix=".heldout.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({k: r[k] for k in ("dimension", "prompt", "completion", "choices", "answer") if k in r},
                                ensure_ascii=False) + "\n")
    os.replace(tmp, pc_path)
    # (a) packed text: prompt and completion as one document, converted to a Megatron prefix
    packed_dir = output_dir / "packed_parquet"
    packed_dir.mkdir(exist_ok=True)
    pq.write_table(pa.table({"text": [r["prompt"] + r["completion"] for r in rows],
                             "dimension": [r["dimension"] for r in rows]}), packed_dir / "heldout.parquet")
    manifest = convert_directory(
        ConvertOptions(input_dir=packed_dir, output_dir=output_dir / "megatron", tokenizer_dir=tokenizer_dir,
                       output_prefix="heldout", num_shards=1),
        show_progress=False,
    )
    (prefix_name,) = manifest["shards"]
    return {"samples": len(rows), "prompt_completion": str(pc_path),
            "validation_prefix": str(output_dir / "megatron" / prefix_name),
            "tokens": manifest["shards"][prefix_name]["tokens"]}
