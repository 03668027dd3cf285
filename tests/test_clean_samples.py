"""The removed-document samples are random, not the first N: each task keeps a seeded uniform sample of what it
removed (steps.SampleWriter), and finalize merges the tasks' samples in proportion to what each removed."""

from __future__ import annotations

import json

from kaiyuan_recipes.data.clean.samples import merge_samples


def test_a_task_keeps_a_seeded_uniform_sample_and_its_count(tmp_path):
    from datatrove.data import Document

    from kaiyuan_recipes.data.clean.steps import SampleWriter

    picks = []
    for _ in range(2):
        folder = tmp_path / f"run{len(picks)}"
        with SampleWriter(str(folder), limit=10) as writer:
            for i in range(1000):
                writer.write(Document(text=f"doc {i}", id=str(i)), rank=3)
        assert (folder / "00003.count").read_text() == "1000"
        picks.append([json.loads(line)["id"] for line in (folder / "00003.jsonl").read_text().splitlines()])
    assert len(picks[0]) == 10 and picks[0] == picks[1]  # seeded: a rerun keeps the same ones
    assert sum(int(i) >= 10 for i in picks[0]) >= 8  # not the first ten


def test_merged_sample_follows_each_tasks_share():
    big = ([f"a{i}" for i in range(100)], 900)   # a task that removed 900, its sample of 100
    small = ([f"b{i}" for i in range(100)], 100)
    from_big = [sum(line.startswith("a") for line in merge_samples([big, small], 100, seed)) for seed in range(50)]
    assert 85 <= sum(from_big) / len(from_big) <= 95
    assert merge_samples([big, small], 100, 7) == merge_samples([big, small], 100, 7)
    assert sorted(merge_samples([(["x", "y"], 2), (["z"], 1)], 10)) == ["x", "y", "z"]  # fewer than asked: all
