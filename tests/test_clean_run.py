"""`kaiyuan data clean` end to end on a generated parquet corpus with planted exact duplicates, near-duplicates at
Jaccard 0.95 / 0.85 / 0.6 and low-quality documents made to fail one named step each (kaiyuan_recipes/data/clean/
synthetic.py): each step removes what was planted (MinHash within its stated error), no clean document is lost, the
manifest adds up, a run killed with SIGKILL resumes to the same bytes, and convert / the blend plan / inspect record
the cleaning. Small corpus, few tasks: the time goes into datatrove's stage start-ups, not the documents."""

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

from kaiyuan_recipes.data.clean.config import load_config
from kaiyuan_recipes.data.clean.inputs import staging_dir_for
from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory
from kaiyuan_recipes.data.clean.synthetic import LOW_QUALITY_STEPS, write_corpus

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "recipes" / "cleaning" / "web.yaml")
SAMPLES = 1000  # every removed document lands in the samples: the test reads which ones each step took


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    plant = write_corpus(root / "raw", files=3, clean_per_file=15, exact_groups=6,
                         near={0.95: 6, 0.85: 6, 0.6: 6}, low_per_step=2, seed=3)
    return root, plant


@pytest.fixture(scope="module")
def reference(corpus):
    root, _ = corpus
    manifest = clean_directory(CleanOptions(root / "raw", root / "ref", CONFIG, workers=1, sample_removed=SAMPLES),
                               log=quiet)
    return root / "ref", manifest


def read_output(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.rglob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def removed_ids(directory: Path, step: str) -> list[str]:
    path = directory / "removed_samples" / f"{step}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["metadata"]["id"] for line in path.read_text().splitlines()]


def steps_of(manifest: dict) -> dict[str, dict]:
    return {s["step"]: s for s in manifest["steps"]}


def test_each_heuristic_and_exact_dedup_removes_exactly_what_was_planted(corpus, reference):
    _, plant = corpus
    out, manifest = reference
    steps = steps_of(manifest)
    assert list(steps) == ["exact_dedup", "length", "gopher_repetition", "gopher_quality", "c4", "fineweb", "minhash"]
    for step in ("exact_dedup", *LOW_QUALITY_STEPS):
        assert steps[step]["removed"] == len(plant.removed_by[step]), step
        got = removed_ids(out, step)
        if step == "exact_dedup":  # which copy stays is datatrove's choice: count per group instead
            texts = [plant.texts[i] for i in got]
            assert sorted(texts) == sorted(plant.texts[i] for i in plant.removed_by[step])
        else:
            assert sorted(got) == sorted(plant.removed_by[step]), step
    assert steps["length"]["removed_by_reason"] == {"too_short": 2}
    assert steps["c4"]["removed_by_reason"] == {"too_few_sentences": 2}
    assert steps["fineweb"]["removed_by_reason"] == {"char_dup_ratio": 2}


def test_minhash_removes_near_duplicates_within_its_stated_error(corpus, reference):
    _, plant = corpus
    out, manifest = reference
    cfg = load_config(CONFIG)
    for pair in plant.near_pairs:
        assert abs(pair["jaccard"] - pair["target"]) < 0.03, pair
    mean, sd = plant.expected_minhash(cfg.minhash.detection_probability)
    removed = steps_of(manifest)["minhash"]["removed"]
    assert abs(removed - mean) <= 3 * sd + 1, (removed, mean, sd)
    kept = {r["id"] for r in read_output(out)}
    took = set(removed_ids(out, "minhash"))
    by_id = {p["base"]: p for p in plant.near_pairs} | {p["variant"]: p for p in plant.near_pairs}
    assert took <= set(by_id), "MinHash removed a document that was not a planted near-duplicate"
    for pair in plant.near_pairs:
        both = {pair["base"], pair["variant"]}
        assert len(both & kept) >= 1, pair  # a pair never loses both
        if cfg.minhash.detection_probability(pair["jaccard"]) > 0.9999:
            assert len(both & kept) == 1, pair  # 0.95: found with certainty
    at_06 = [p for p in plant.near_pairs if p["target"] == 0.6]
    assert sum({p["base"], p["variant"]} <= kept for p in at_06) >= len(at_06) // 2  # below threshold: mostly kept
    assert manifest["minhash"]["detection_probability"]["0.85"] == pytest.approx(
        cfg.minhash.detection_probability(0.85), abs=1e-4)


def test_no_clean_document_is_lost_and_the_columns_are_kept(corpus, reference):
    root, plant = corpus
    out, _ = reference
    rows = read_output(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    by_id = {r["id"]: r for r in rows}
    texts = [r["text"] for r in rows]
    for doc_id in plant.clean_ids:
        if doc_id.startswith("exact-"):  # a duplicated document: one copy, whichever
            assert texts.count(plant.texts[doc_id]) == 1, doc_id
        else:
            assert by_id[doc_id]["text"] == plant.texts[doc_id], doc_id  # untouched, byte for byte
    source = pq.read_schema(plant.files[0])
    for path in sorted(out.glob("*.parquet")):
        assert pq.read_schema(path).remove_metadata().equals(source.remove_metadata())
        original = {r["id"]: r["rank"] for r in pq.read_table(root / "raw" / path.name).to_pylist()}
        kept = pq.read_table(path).to_pylist()
        assert all(r["rank"] == original[r["id"]] for r in kept)
        ranks = [r["rank"] for r in kept]
        assert ranks == sorted(ranks)  # input order kept within a file


def test_manifest_counts_tokens_and_records_the_run(corpus, reference):
    from tokenizers import Tokenizer

    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    root, plant = corpus
    out, manifest = reference
    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    count = lambda texts: sum(len(e.ids) for e in tok.encode_batch(texts))  # noqa: E731
    assert manifest["tokens_in"] == count(list(plant.texts.values()))  # every row, copies included
    assert manifest["tokens_out"] == count([r["text"] for r in read_output(out)])
    steps = manifest["steps"]
    assert steps[0]["tokens_in"] == manifest["tokens_in"]
    for before, after in zip(steps, steps[1:]):
        assert before["documents_out"] == after["documents_in"] and before["tokens_out"] == after["tokens_in"]
    assert manifest["documents_in"] == sum(pq.ParquetFile(f).metadata.num_rows for f in plant.files)
    assert manifest["documents_out"] == len(read_output(out))
    assert [f["path"] for f in manifest["inputs"]] == [f.name for f in plant.files]
    assert all(f["bytes"] == (root / "raw" / f["path"]).stat().st_size for f in manifest["inputs"])
    assert manifest["config_hash"] == load_config(CONFIG).config_hash()
    assert manifest["config"]["minhash"]["bands"] == 14 and manifest["datatrove_version"] == "0.10.1"
    assert not staging_dir_for(out).exists()  # a finished local run leaves only its output


def test_a_rerun_is_up_to_date_and_inspect_shows_the_manifest(corpus, reference):
    root, _ = corpus
    out, manifest = reference
    again = clean_directory(CleanOptions(root / "raw", out, CONFIG, workers=1, sample_removed=SAMPLES), log=quiet)
    assert again["up_to_date"] and again["config_hash"] == manifest["config_hash"]
    proc = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "inspect", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)[0]
    assert report["cleaning"]["documents_out"] == manifest["documents_out"]
    assert report["steps"]["minhash"]["documents_out"] == manifest["documents_out"]


def test_convert_and_the_blend_plan_record_the_cleaning(corpus, reference, tmp_path):
    from kaiyuan_recipes.data.blend import load_source, plan_categories
    from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    out, manifest = reference
    converted = convert_directory(ConvertOptions(out, tmp_path / "tok", default_tokenizer_dir(), "web", num_shards=1,
                                                 workers_per_shard=1), show_progress=False)
    assert converted["cleaning"]["config_hash"] == manifest["config_hash"]
    assert converted["cleaning"]["documents_out"] == sum(s["documents"] for s in converted["shards"].values())
    assert converted["cleaning"]["removed"]["minhash"] == steps_of(manifest)["minhash"]["removed"]
    source = load_source("web", str(tmp_path / "tok"))
    plan = plan_categories({"total_tokens": 1000, "categories": {"web": {"share": 1.0}}}, {"web": [source]})
    assert plan["sources"][0]["cleaning"]["config_hash"] == manifest["config_hash"]


def wait_for_file(folder: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if folder.is_dir() and any(folder.iterdir()):
            return
        time.sleep(0.2)
    raise AssertionError(f"nothing in {folder} within {timeout:g}s")


def test_a_killed_run_resumes_the_missing_tasks_to_the_same_bytes(corpus, reference, monkeypatch):
    """SIGKILL once the filter stage has completed a task; the rerun (other worker and hash-range counts) skips what
    completed and writes the same files, byte for byte, as the uninterrupted run."""
    root, _ = corpus
    ref_out, ref_manifest = reference
    out = root / "resumed"
    staging = staging_dir_for(out)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "clean", "--input-dir",
                             str(root / "raw"), "--output-dir", str(out), "--config", CONFIG, "--workers", "1",
                             "--sample-removed", str(SAMPLES)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_file(staging / "logs" / "filter" / "completions", 300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not out.exists()  # the output appears whole or not at all
    done = sorted(p.name for p in (staging / "logs" / "filter" / "completions").iterdir())
    assert done and len(done) < 3, done
    stats = staging / "logs" / "filter" / "stats"
    stamps = {r: (stats / f"{r}.json").stat().st_mtime_ns for r in done}
    import kaiyuan_recipes.data.clean.run as run_module

    # keep the staging directory (its logs) after the rerun, to see which tasks ran again
    monkeypatch.setattr(run_module, "shutil", type("KeepStaging", (), {"rmtree": staticmethod(lambda *a, **k: None),
                                                                        "copyfile": staticmethod(__import__(
                                                                            "shutil").copyfile)}))
    manifest = clean_directory(CleanOptions(root / "raw", out, CONFIG, workers=2, sample_removed=SAMPLES,
                                            finder_workers=1, bucket_workers=2), log=quiet)
    assert {r: (stats / f"{r}.json").stat().st_mtime_ns for r in done} == stamps  # completed tasks not redone
    assert sorted(p.stem for p in stats.glob("*.json")) == ["00000", "00001", "00002"]
    files = sorted(p.relative_to(ref_out) for p in ref_out.rglob("*") if p.is_file() and p.suffix == ".parquet")
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p.suffix == ".parquet")
    for rel in files:
        assert (out / rel).read_bytes() == (ref_out / rel).read_bytes(), rel
    assert manifest["steps"] == ref_manifest["steps"]
    for step in ref_manifest["removed_samples"]:  # the same removed documents, in the same order
        assert (out / "removed_samples" / f"{step}.jsonl").read_text() == \
            (ref_out / "removed_samples" / f"{step}.jsonl").read_text()


def planted_ids(raw: Path) -> dict[str, str]:
    """The document id (FILE#row) -> the planted id column."""
    ids = {}
    for path in sorted(raw.glob("*.parquet")):
        ids.update({f"{path.name}#{n}": r["id"] for n, r in enumerate(pq.read_table(path).to_pylist())})
    return ids


def test_the_output_holds_a_removal_report_datatroves_stats_and_the_run(corpus, reference):
    root, plant = corpus
    out, manifest = reference
    steps = manifest["steps"]
    assert [s["characters_in"] for s in steps[1:]] == [s["characters_out"] for s in steps[:-1]]
    assert steps[0]["characters_in"] == sum(len(t) for t in plant.texts.values())
    report = (out / manifest["report"]["table"]).read_text()
    for s in steps:
        removed = s["characters_in"] - s["characters_out"]
        assert f"| {s['step']} | {s['documents_in']:,} | {s['removed']:,} |" in report
        assert f"{removed:,} (" in report
    assert (out / manifest["report"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(manifest["datatrove_stats"]) >= {"filter", "minhash_filter", "minhash_cluster"}
    filter_stats = json.loads((out / manifest["datatrove_stats"]["filter"]).read_text())
    assert filter_stats[0]["stats"]["documents"]["total"] == manifest["documents_in"]
    run = manifest["run"]
    assert run["host"] and run["seconds"] > 0 and run["started_at"] < run["finished_at"] and run["kaiyuan_recipes"]


def test_a_removed_near_duplicate_names_its_cluster_and_the_copy_kept(corpus, reference):
    root, plant = corpus
    out, _ = reference
    ids = planted_ids(root / "raw")
    pairs = {frozenset((p["base"], p["variant"])) for p in plant.near_pairs}
    lines = [json.loads(line) for line in (out / "removed_samples" / "minhash.jsonl").read_text().splitlines()]
    assert lines
    kept_ids = {row["id"] for row in read_output(out)}
    for doc in lines:
        meta = doc["metadata"]
        assert meta["minhash_cluster_id"] >= 0
        kept = ids[meta["kept_copy"]]
        assert kept in kept_ids and frozenset((meta["id"], kept)) in pairs, (meta["id"], kept)


def test_a_removed_exact_duplicate_names_its_group_and_the_copy_kept(corpus, reference):
    root, plant = corpus
    out, _ = reference
    ids = planted_ids(root / "raw")
    lines = [json.loads(line) for line in (out / "removed_samples" / "exact_dedup.jsonl").read_text().splitlines()]
    assert len(lines) == len(plant.removed_by["exact_dedup"])
    kept_ids = {row["id"] for row in read_output(out)}
    for doc in lines:
        meta = doc["metadata"]
        kept = ids[meta["kept_copy"]]
        assert kept in kept_ids and kept != meta["id"] and plant.texts[kept] == doc["text"], (meta["id"], kept)
        assert isinstance(meta["exact_dedup_hash"], int)
