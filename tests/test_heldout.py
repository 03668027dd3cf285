"""Held-out set: a fixture of the real shape (7 dimensions, 4 per dimension instead of 400)."""

import json
import re

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
    src = write_jsonl(tmp_path / "bad.jsonl", rows, extra_lines=[
        "{not json", '{"dimension": "math", "prompt": "p", "completion": "c", "choices": "A/B"}'])
    with pytest.raises(HeldoutError) as err:
        read_heldout(src, per_dimension=4)
    text = str(err.value)
    assert "line 4: dimension 'poetry'" in text and "line 6: 'completion' missing" in text
    assert "line 29: not JSON" in text and "line 30: 'choices' must be a list" in text
    assert "dimension 'science_reasoning': 3 samples, expected 4 (--per-dimension)" in text


def test_empty_heldout_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(HeldoutError, match="holds no samples"):
        read_heldout(tmp_path / "empty.jsonl", per_dimension=4)


@pytest.mark.parametrize("extra, message", [
    ({"choices": [" a", " b"], "answer": 2}, "'answer' must be an integer index of the choices \\(0..1\\), got 2"),
    ({"choices": [" a", " b"]}, "'answer' must be an integer index"),
    ({"choices": [" a"], "answer": 0}, "'choices' must be a list of 2 or more non-empty strings"),
    ({"choices": [" a", ""], "answer": 0}, "'choices' must be a list of 2 or more"),
    ({"choices": [" a", " b"], "answer": "0"}, "got '0'"),
    ({"answer": 0}, "'choices' must be a list"),
])
def test_heldout_and_eval_reject_the_same_multiple_choice_lines(tmp_path, extra, message):
    """One check, in one place: a line `kaiyuan data heldout` accepts is one `kaiyuan eval heldout` scores."""
    from kaiyuan_recipes.data.heldout import HeldoutError, read_heldout
    from kaiyuan_recipes.eval.heldout_eval import load_samples

    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"dimension": "math", "prompt": "1+1=", "completion": " 2"} | extra) + "\n")
    with pytest.raises(HeldoutError, match=message):
        read_heldout(path, per_dimension=1)
    report = load_samples(path)
    assert not report.samples and any(re.search(message, p) for p in report.problems), report.problems


def test_a_non_utf8_heldout_line_names_file_and_line(tmp_path):
    from kaiyuan_recipes.data.heldout import HeldoutError, read_heldout

    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"dimension": "math", "prompt": "a", "completion": "b"}\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(HeldoutError, match=r"h.jsonl: line 2: not UTF-8"):
        read_heldout(path, per_dimension=1)


def test_a_line_with_two_problems_is_one_skipped_line(tmp_path):
    from kaiyuan_recipes.data.heldout_scoring import load_samples

    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([json.dumps({"dimension": "math", "prompt": "1+1=", "completion": " 2"}),
                               json.dumps({"dimension": "math", "prompt": "p", "choices": [" a"], "answer": 0}),
                               "{oops"]) + "\n")
    report = load_samples(path)
    assert len(report.samples) == 1
    assert len(report.problems) == 2, report.problems  # what `kaiyuan eval heldout` counts as skipped lines
    assert report.problems[0].startswith("line 2: 'completion' missing or empty; 'choices' must be a list")
    assert report.problems[1].startswith("line 3: not JSON")
