"""Held-out set: a fixture of the real shape (7 dimensions, 4 per dimension instead of 400)."""

import json

import pytest

from kaiyuan_recipes.data.heldout import DIMENSIONS, HeldoutError, read_heldout, write_heldout
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir


def fixture_rows(per_dim=4):
    rows = []
    for dim in DIMENSIONS:
        for i in range(per_dim):
            row = {"dimension": dim, "prompt": f"[{dim} #{i}] 问题：1+{i}=?\n答：", "completion": f" {1 + i}"}
            if dim in ("science_reasoning", "chinese_exam") and i % 2 == 0:
                row["choices"] = [f" {1 + i}", f" {2 + i}", " 0"]
                row["answer"] = 0
            rows.append(row)
    return rows


def write_jsonl(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        for line in extra_lines:
            fh.write(line + "\n")
    return path


def test_heldout_produces_validation_prefix_and_prompt_completion(tmp_path, megatron_parallel):
    src = write_jsonl(tmp_path / "heldout.jsonl", fixture_rows())
    out = write_heldout(src, tmp_path / "out", default_tokenizer_dir(), per_dimension=4)
    assert out["samples"] == 28
    pc = [json.loads(line) for line in open(out["prompt_completion"], encoding="utf-8")]
    assert len(pc) == 28 and pc[0]["completion"] == " 1" and "choices" in pc[0]
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(out["validation_prefix"])
    assert len(ds) == 28 and int(ds.sequence_lengths.sum()) == out["tokens"]
    assert ds[0][-1] == 151643


def test_bad_heldout_lines_are_all_reported(tmp_path):
    rows = fixture_rows()
    rows[3] = {"dimension": "poetry", "prompt": "x", "completion": "y"}
    rows[5] = {"dimension": "logic", "prompt": "x"}
    src = write_jsonl(tmp_path / "bad.jsonl", rows, extra_lines=["{not json", '{"dimension": "math", "prompt": "p", "completion": "c", "choices": "A/B"}'])
    with pytest.raises(HeldoutError) as err:
        read_heldout(src, per_dimension=4)
    text = str(err.value)
    assert "line 4: dimension 'poetry'" in text and "line 6: 'completion' missing" in text
    assert "line 29: not JSON" in text and "line 30: 'choices' must be a list" in text
    assert "dimension 'science_reasoning': 3 samples, expected 4" in text


def test_empty_heldout_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(HeldoutError, match="holds no samples"):
        read_heldout(tmp_path / "empty.jsonl", per_dimension=4)
