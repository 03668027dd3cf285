"""Of identical documents, `kaiyuan data clean` keeps the first in input order (file order, then row), whatever
`--task-bytes` cuts the file into and whatever `--workers` runs it: a performance knob never changes the output's
content. A removed copy's `kept_copy` names that first copy as FILE#row. A MinHash near-duplicate pair likewise keeps
its earlier document under every cut."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory

ROW_GROUP = 10
GROUPS = 5
NAME = "docs.parquet"
# identical texts: the first copy is not the first row of its group, and a later copy sits nearer the start of its
# group than the first does (so a split that numbers documents per task would prefer it); one group lies in one row
# group (rows 22, 25) with a later copy at row 31
EXACT = {"a": [7, 13, 41], "b": [22, 25, 31]}
NEAR = [16, 42]  # one word apart: a MinHash near-duplicate pair across row groups


def quiet(*_):
    pass


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(["alpha", "bravo", "delta", "gamma", "omega", "kappa", "sigma", "theta", "lambda",
                                "zeta", "river", "stone", "cloud", "field", "north", "glass", "maple", "ember",
                                f"w{rng.randrange(10_000)}"]) for _ in range(n))


def _texts() -> list[str]:
    rng = random.Random(5)
    texts = [_words(rng, 80) for _ in range(ROW_GROUP * GROUPS)]
    for group in EXACT.values():
        for row in group[1:]:
            texts[row] = texts[group[0]]
    words = texts[NEAR[0]].split()
    words[40] = "unrelated"
    texts[NEAR[1]] = " ".join(words)
    return texts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("keepfirst")
    (root / "raw").mkdir()
    texts = _texts()
    pq.write_table(pa.table({"text": texts, "row": list(range(len(texts)))}), root / "raw" / NAME,
                   row_group_size=ROW_GROUP)
    config = root / "dedup.yaml"
    config.write_text(json.dumps({"count_tokens": False, "steps": {
        "exact_dedup": True, "minhash": {"ngrams": 5, "bands": 14, "rows": 8, "seed": 1}}}))
    two_groups = 2 * pq.ParquetFile(root / "raw" / NAME).metadata.row_group(0).total_byte_size

    def clean(name: str, **kw) -> tuple[Path, dict]:
        out = root / name
        return out, clean_directory(CleanOptions(root / "raw", out, str(config), sample_removed=100, **kw), log=quiet)

    return {"one task": clean("whole", workers=1),
            "a task per row group, 2 workers": clean("groups", workers=2, task_bytes=1),
            "two row groups a task, 1 worker": clean("pairs", workers=1, task_bytes=two_groups)}


def kept_rows(out: Path) -> list[int]:
    return sorted(r["row"] for p in sorted(out.rglob("*.parquet")) for r in pq.read_table(p).to_pylist())


def removed(out: Path, step: str) -> dict[str, str]:
    """Removed document id (FILE#row) -> the kept copy its sample names."""
    path = out / "removed_samples" / f"{step}.jsonl"
    return {d["id"]: d["metadata"]["kept_copy"] for d in map(json.loads, path.read_text().splitlines())}


def test_the_runs_cut_the_file_differently(runs):
    one, groups, pairs = (m["tasks"] for _, m in runs.values())
    assert one == 1 and groups == GROUPS and 1 < pairs < GROUPS


@pytest.mark.parametrize("cut", ["one task", "a task per row group, 2 workers", "two row groups a task, 1 worker"])
def test_the_first_identical_copy_in_input_order_is_kept_and_named(runs, cut):
    out, _ = runs[cut]
    later = {row for group in EXACT.values() for row in group[1:]}
    assert kept_rows(out) == [r for r in range(ROW_GROUP * GROUPS) if r not in later and r != NEAR[1]]
    assert removed(out, "exact_dedup") == {f"{NAME}#{row}": f"{NAME}#{group[0]}"
                                           for group in EXACT.values() for row in group[1:]}


@pytest.mark.parametrize("cut", ["one task", "a task per row group, 2 workers", "two row groups a task, 1 worker"])
def test_a_near_duplicate_pair_keeps_its_earlier_document(runs, cut):
    out, _ = runs[cut]
    assert removed(out, "minhash") == {f"{NAME}#{NEAR[1]}": f"{NAME}#{NEAR[0]}"}


def test_the_output_is_the_same_bytes_whatever_the_cut(runs):
    (whole, _), *others = runs.values()
    content = pq.read_table(whole / NAME)
    for out, _ in others:
        parts = [pq.read_table(p) for p in sorted(out.glob("*.parquet"))]
        assert pa.concat_tables(parts).equals(content)


def test_more_tasks_than_exact_dedup_can_order_is_refused_before_anything_is_written(runs, monkeypatch):
    import kaiyuan_recipes.data.clean.run as run_module
    from kaiyuan_recipes.data.clean.inputs import CleanInputError, staging_dir_for

    whole, _ = runs["one task"]
    root = whole.parent
    out = root / "too-many"
    monkeypatch.setattr(run_module, "EXACT_DEDUP_MAX_TASKS", GROUPS - 1)
    with pytest.raises(CleanInputError, match=f"into {GROUPS} tasks; exact dedup orders at most {GROUPS - 1}"):
        clean_directory(CleanOptions(root / "raw", out, str(root / "dedup.yaml"), task_bytes=1), log=quiet)
    assert not out.exists() and not staging_dir_for(out).exists()
