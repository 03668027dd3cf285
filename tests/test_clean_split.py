"""A large input file is read by several tasks: `--task-bytes` cuts it at parquet row groups into work units, each
one datatrove task, whatever the worker count. The output is the same bytes with 1 or 2 workers, and the same
removals as when the file is one task: exact dedup and MinHash see every document, also a copy in another task
than its duplicate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.data.clean.inputs import staging_dir_for
from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory
from kaiyuan_recipes.data.clean.synthetic import write_corpus

ROOT = Path(__file__).resolve().parents[1]
ROW_GROUP = 20


def quiet(*_):
    pass


def dedup_only(tmp: Path) -> str:
    path = tmp / "dedup.yaml"
    path.write_text(json.dumps({"count_tokens": False, "steps": {
        "exact_dedup": True, "length": {"min_chars": 100},
        "minhash": {"ngrams": 5, "bands": 14, "rows": 8, "seed": 1}}}))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    plant = write_corpus(root / "raw", files=1, clean_per_file=40, exact_groups=8, near={0.95: 6},
                         low_per_step=1, seed=11)
    big = plant.files[0]
    pq.write_table(pq.read_table(big), big, row_group_size=ROW_GROUP)  # several row groups in one file
    config = dedup_only(root)

    def clean(name: str, **kw) -> tuple[Path, dict]:
        out = root / name
        return out, clean_directory(CleanOptions(root / "raw", out, config, sample_removed=1000, **kw), log=quiet)

    return {"plant": plant, "file": big, "split2": clean("split2", workers=2, task_bytes=1),
            "split1": clean("split1", workers=1, task_bytes=1), "whole": clean("whole", workers=2)}


def parquet_files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))


def test_one_file_is_read_by_one_task_per_row_group_run(runs):
    groups = pq.ParquetFile(runs["file"]).metadata.num_row_groups
    out, manifest = runs["split2"]
    assert groups >= 4 and manifest["tasks"] == groups
    assert runs["whole"][1]["tasks"] == 1
    names = parquet_files(out)
    assert len(names) > 1 and set(names) <= {f"part-00000-{k:05d}-of-{groups:05d}.parquet" for k in range(groups)}
    for o in manifest["outputs"]:  # each output names the row groups it came from
        k = int(o["path"][11:16])
        assert o["input"] == "part-00000.parquet" and o["row_groups"] == [k, k + 1]


def test_the_split_output_is_the_same_bytes_with_one_or_two_workers(runs):
    (a, ma), (b, mb) = runs["split2"], runs["split1"]
    assert parquet_files(a) == parquet_files(b)
    for name in parquet_files(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert ma["steps"] == mb["steps"]
    for step in ma["removed_samples"]:
        assert (a / "removed_samples" / f"{step}.jsonl").read_text() == \
            (b / "removed_samples" / f"{step}.jsonl").read_text()


def test_dedup_across_tasks_removes_what_one_task_removes(runs):
    (split, ms), (whole, mw) = runs["split2"], runs["whole"]
    plant = runs["plant"]
    kept = [r for name in parquet_files(split) for r in pq.read_table(split / name).to_pylist()]
    one = pq.read_table(whole / "part-00000.parquet").to_pylist()
    assert ms["steps"] == mw["steps"]
    assert {s["step"]: s["removed"] for s in ms["steps"]}["exact_dedup"] == len(plant.removed_by["exact_dedup"])
    # the first copy of a group stays whatever the cut (tests/test_clean_keep_first.py): the same texts and others
    assert sorted(r["text"] for r in kept if r["id"].startswith("exact-")) == \
        sorted(r["text"] for r in one if r["id"].startswith("exact-"))
    assert [r for r in kept if not r["id"].startswith(("exact-", "near-"))] == \
        [r for r in one if not r["id"].startswith(("exact-", "near-"))]
    # some removed exact copy has its kept copy in another task's rows: dedup saw across the cut
    copies = [json.loads(line) for line in (split / "removed_samples" / "exact_dedup.jsonl").open()]

    def task(doc_id: str) -> int:  # one task per row group here
        return int(doc_id.rsplit("#", 1)[1]) // ROW_GROUP

    assert any(task(c["metadata"]["kept_copy"]) != task(c["id"]) for c in copies)


def test_a_killed_split_run_resumes_to_the_same_bytes_and_each_task_read_its_rows(runs, monkeypatch):
    """SIGKILL once the filter stage has completed a task of the file; the rerun (2 workers) skips what completed
    and writes what the 1-worker run wrote. datatrove's own per-task stats show every task read documents."""
    ref, ref_manifest = runs["split1"]
    root = ref.parent
    out, staging = root / "resumed", staging_dir_for(root / "resumed")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "clean", "--input-dir",
                             str(root / "raw"), "--output-dir", str(out), "--config", str(root / "dedup.yaml"),
                             "--workers", "1", "--task-bytes", "1", "--sample-removed", "1000"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    completions = staging / "logs" / "filter" / "completions"
    try:
        deadline = time.monotonic() + 300
        while not (completions.is_dir() and any(completions.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    done = sorted(p.name for p in completions.iterdir())
    assert not out.exists() and done and len(done) < ref_manifest["tasks"], done
    stats = staging / "logs" / "filter" / "stats"
    stamps = {r: (stats / f"{r}.json").stat().st_mtime_ns for r in done}
    import kaiyuan_recipes.data.clean.run as run_module

    # keep the staging directory (its logs) after the rerun, to read each task's stats
    monkeypatch.setattr(run_module, "shutil", type("KeepStaging", (), {"rmtree": staticmethod(lambda *a, **k: None),
                                                                        "copyfile": staticmethod(__import__(
                                                                            "shutil").copyfile)}))
    manifest = clean_directory(CleanOptions(root / "raw", out, str(root / "dedup.yaml"), workers=2, task_bytes=1,
                                            sample_removed=1000), log=quiet)
    assert {r: (stats / f"{r}.json").stat().st_mtime_ns for r in done} == stamps  # completed tasks not redone
    assert parquet_files(out) == parquet_files(ref)
    for name in parquet_files(ref):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert manifest["steps"] == ref_manifest["steps"]
    per_task = [json.loads(p.read_text())[0]["stats"]["documents"] for p in sorted(stats.glob("*.json"))]
    assert len(per_task) == manifest["tasks"] > 1
    assert all(d["total"] > 0 for d in per_task) and sum(d["total"] for d in per_task) == manifest["documents_in"]
