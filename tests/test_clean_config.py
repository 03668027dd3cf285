"""`kaiyuan data clean` before anything runs: the cleaning configs (shipped and wrong ones), the MinHash expectation,
and every bad input refused with the file (and row) named and nothing written. Fast: no pipeline runs here
(tests/test_clean_run.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.data.clean.config import STEP_ORDER, CleanConfigError, config_from_dict, load_config
from kaiyuan_recipes.data.clean.inputs import CleanInputError, staging_dir_for
from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "recipes" / "cleaning").glob("*.yaml"))


def test_one_shipped_config_per_laoyao_category_and_each_loads():
    assert {p.stem for p in SHIPPED} >= {"web", "edu", "chinese", "code"}
    for path in SHIPPED:
        cfg = load_config(path)
        steps = cfg.enabled_steps()
        assert steps == [s for s in STEP_ORDER if s in steps], path  # the fixed order
        assert {"exact_dedup", "minhash"} <= set(steps), path
        assert "language" not in steps, path  # needs a local model: never on by default
    assert load_config(ROOT / "recipes/cleaning/chinese.yaml").language == "zh"
    assert "gopher_quality" not in load_config(ROOT / "recipes/cleaning/code.yaml").enabled_steps()


@pytest.mark.parametrize("raw, message", [
    ({"steps": {"minhash": {}, "dedup": True}}, "unknown step(s) ['dedup']"),
    ({"steps": {"gopher_quality": {"min_doc_word": 10}}}, "unknown parameter(s) ['min_doc_word'] for GopherQuality"),
    ({"steps": {"gopher_quality": {"words": "spacy"}}}, "gopher_quality.words: expected one of ['whitespace', "),
    ({"steps": {"c4": {"rewrite_lines": 1}}}, "c4.rewrite_lines: expected one of [True, False], got 1"),
    ({"steps": {"gopher_quality": {"exclusion_writer": None}}}, "unknown parameter(s) ['exclusion_writer']"),
    ({"steps": {"length": {"min_chars": "100"}}}, "steps.length.min_chars: expected int/float"),
    ({"steps": {"length": {"min_char": 1}}}, "steps.length: unknown key(s) ['min_char']"),
    ({"steps": {"minhash": {"bands": 0}}}, "steps.minhash.bands: expected a positive integer"),
    ({"steps": {"language": {"languages": ["en"]}}}, "steps.language needs model_path"),
    ({"steps": {"exact_dedup": False}}, "every step is off"),
    ({"steps": {}, "extra": 1}, "unknown key(s) ['extra']"),
])
def test_a_wrong_config_is_refused_by_key(raw, message):
    with pytest.raises(CleanConfigError) as err:
        config_from_dict(raw, "x.yaml")
    assert message in str(err.value)


def test_minhash_expectation_is_the_banding_formula():
    cfg = config_from_dict({"steps": {"minhash": {"bands": 14, "rows": 8}}})
    exp = cfg.minhash_expectation()
    assert exp["threshold"] == pytest.approx((1 / 14) ** (1 / 8), abs=1e-4)
    for s, p in exp["detection_probability"].items():
        assert p == pytest.approx(1 - (1 - float(s) ** 8) ** 14, abs=1e-4)
    assert exp["detection_probability"]["0.6"] < 0.25 < 0.98 < exp["detection_probability"]["0.85"]


def test_config_hash_follows_the_resolved_settings():
    a = config_from_dict({"steps": {"minhash": {}}})
    b = config_from_dict({"steps": {"minhash": {"seed": 1}}})  # the default, spelt out
    c = config_from_dict({"steps": {"minhash": {"seed": 2}}})
    assert a.config_hash() == b.config_hash() != c.config_hash()


def test_datatrove_xxhash_path_still_needs_xxhash_below_4():
    """Why the pipeline hashes with sha1 (pipeline.hash_config): datatrove hands str to xxhash, which xxhash 4
    refuses. When this fails, datatrove or xxhash accepts it again and the default xxhash can come back."""
    from datatrove.utils.hashes.xxhash import xxhash64

    with pytest.raises(TypeError):
        xxhash64("some text")


def write(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def good(path: Path, n: int = 3) -> Path:
    return write(path, pa.table({"text": [f"document {i}" for i in range(n)], "rank": [float(i) for i in range(n)]}))


def refused(tmp_path: Path, **kw) -> str:
    out = kw.pop("output_dir", tmp_path / "out")
    existed = Path(out).exists()
    with pytest.raises((CleanInputError, CleanConfigError)) as err:
        clean_directory(CleanOptions(tmp_path / "raw", out, str(ROOT / "recipes/cleaning/web.yaml"), **kw),
                        log=lambda *_: None)
    assert not staging_dir_for(out).exists()  # nothing written
    assert existed or not Path(out).exists()
    return str(err.value)


def test_unreadable_parquet_is_named(tmp_path):
    good(tmp_path / "raw/a.parquet")
    (tmp_path / "raw/b.parquet").write_bytes(b"PAR1 this is not parquet")
    assert f"{tmp_path / 'raw/b.parquet'}: not a readable parquet file" in refused(tmp_path)


def test_empty_file_and_file_without_rows_are_named(tmp_path):
    good(tmp_path / "raw/a.parquet")
    (tmp_path / "raw/b.parquet").write_bytes(b"")
    assert f"{tmp_path / 'raw/b.parquet'}: empty file (0 bytes)" in refused(tmp_path)
    write(tmp_path / "raw/b.parquet", pa.table({"text": pa.array([], pa.string()), "rank": pa.array([], pa.float64())}))
    assert f"{tmp_path / 'raw/b.parquet'}: no rows" in refused(tmp_path)


def test_schema_mismatch_names_both_files_and_the_column(tmp_path):
    good(tmp_path / "raw/a.parquet")
    write(tmp_path / "raw/b.parquet", pa.table({"text": ["x"], "rank": [1]}))  # int64 rank
    message = refused(tmp_path)
    assert f"{tmp_path / 'raw/b.parquet'}: schema differs from {tmp_path / 'raw/a.parquet'}" in message
    assert "rank: double" in message and "rank: int64" in message


def test_null_text_names_the_row(tmp_path):
    good(tmp_path / "raw/a.parquet")
    write(tmp_path / "raw/b.parquet", pa.table({"text": ["x", "y", None, "z"], "rank": [0.0, 1.0, 2.0, 3.0]}))
    assert f"{tmp_path / 'raw/b.parquet'}: row 2 (0-based): column 'text' is null" in refused(tmp_path)


def test_null_found_without_footer_statistics(tmp_path):
    path = tmp_path / "raw/a.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["x", None], "rank": [0.0, 1.0]}), path, write_statistics=False)
    assert f"{path}: row 1 (0-based): column 'text' is null" in refused(tmp_path)


def test_non_string_text_and_missing_column(tmp_path):
    write(tmp_path / "raw/a.parquet", pa.table({"text": [1, 2], "rank": [0.0, 1.0]}))
    assert "column 'text' has type int64; expected string" in refused(tmp_path)
    assert "no column 'body'" in refused(tmp_path, text_key="body")


def test_output_dir_holding_other_files_or_inside_the_input(tmp_path):
    good(tmp_path / "raw/a.parquet")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert f"{tmp_path / 'out'}: the output directory holds other files (notes.txt)" in refused(tmp_path)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    assert "inside the input directory" in refused(tmp_path, output_dir=tmp_path / "raw" / "clean")


def test_language_step_refuses_at_start_without_a_local_model(tmp_path):
    good(tmp_path / "raw/a.parquet")
    cfg = tmp_path / "lang.yaml"
    cfg.write_text("steps:\n  language: {model_path: /nonexistent/lid.176.bin}\n")
    with pytest.raises(CleanConfigError) as err:
        clean_directory(CleanOptions(tmp_path / "raw", tmp_path / "out", str(cfg)), log=lambda *_: None)
    assert "/nonexistent/lid.176.bin not found" in str(err.value) and "never downloads" in str(err.value)
    assert not staging_dir_for(tmp_path / "out").exists()


def test_reader_adapter_refuses_a_null_text_the_footer_missed(tmp_path):
    from kaiyuan_recipes.data.clean.steps import CleanDataError, make_reader, read_row

    reader = make_reader(str(tmp_path), [("a.parquet", 0, 1, 0)], "text", "error", 1 << 20)
    with pytest.raises(CleanDataError, match=r"a\.parquet: row 7 \(0-based\): column 'text' is null"):
        read_row(reader, {"text": None, "rank": 1.0}, "a.parquet", 7)
    doc = read_row(reader, {"text": "hello", "rank": 1.0}, "a.parquet", 7)
    assert doc["text"] == "hello" and doc["metadata"]["rank"] == 1.0


def test_length_filter_reasons():
    from datatrove.data import Document

    from kaiyuan_recipes.data.clean.steps import LengthCharFilter

    f = LengthCharFilter(min_chars=10, max_chars=100, max_non_printable_ratio=0.01, max_replacement_char_ratio=0.01,
                         min_cjk_ratio=None)
    assert f.filter(Document("short", "a")) == (False, "too_short")
    assert f.filter(Document("x" * 101, "a")) == (False, "too_long")
    assert f.filter(Document("abc\ufffd" * 5, "a")) == (False, "replacement_chars")
    assert f.filter(Document("abcdefghij\x00\x01", "a")) == (False, "non_printable")
    assert f.filter(Document("a normal line\nand another", "a")) is True
    cjk = LengthCharFilter(min_cjk_ratio=0.3)
    assert cjk.filter(Document("mostly latin text 中", "a")) == (False, "too_little_cjk")
    assert cjk.filter(Document("中文的文本 text", "a")) is True


def test_step_counts_from_a_single_task(tmp_path):
    """One input file: one stats file per stage, which datatrove reads back as numbers, not MetricStats."""
    from datatrove.data import Document
    from datatrove.utils.stats import PipelineStats

    from kaiyuan_recipes.data.clean.manifest import RunPlan, StepStats, step_records
    from kaiyuan_recipes.data.clean.steps import LengthCharFilter

    f = LengthCharFilter(min_chars=5)
    list(f.run(iter([Document("long enough", "0"), Document("tiny", "1"), Document("also long", "2")])))
    stats = tmp_path / "logs" / "filter" / "stats"
    stats.mkdir(parents=True)
    (stats / "00000.json").write_text(PipelineStats([f, f]).to_json())
    plan = RunPlan(input_dir="in", output_dir="out", staging_dir=str(tmp_path), text_key="text",
                   inputs=[{"path": "a.parquet", "bytes": 1, "rows": 3}], config={"count_tokens": False},
                   config_hash="h", config_source="s", minhash=None, sample_removed=0, executor="local", tasks=1,
                   datatrove_version="x", steps=[StepStats("length", "filter", 1, "filter", 1)],
                   input_stats=StepStats("input", "filter", 0))
    head, records = step_records(plan)
    assert records == [{"step": "length", "documents_in": 3, "documents_out": 2, "removed": 1, "tokens_in": None,
                        "tokens_out": None, "removed_by_reason": {"too_short": 1},
                        "characters_in": 20, "characters_out": len("long enough") + len("also long")}]


def test_length_filter_character_classes_are_unicodedata_s():
    """The non-printable and whitespace patterns count exactly the characters the per-character definition does."""
    import sys
    import unicodedata

    from kaiyuan_recipes.data.clean.steps import CJK, NON_PRINTABLE, WHITESPACE

    chars = "".join(map(chr, range(sys.maxunicode + 1)))
    assert NON_PRINTABLE.findall(chars) == [c for c in chars if unicodedata.category(c) in ("Cc", "Cs", "Co")
                                            and not c.isspace()]
    assert WHITESPACE.findall(chars) == [c for c in chars if c.isspace()]
    assert CJK.findall(chars) == [c for c in chars if "\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf"]


def test_minhash_digit_normalization_is_a_switch():
    """datatrove's MinHash normalises every number to 0 before shingling: exercises that differ only in their numbers
    are then one document. `normalize_digits: false` keeps them apart."""
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    from kaiyuan_recipes.data.clean.pipeline import minhash_config

    a = "Solve 3x + 7 = 22 for x, then check the answer by putting it back into the equation above. " * 3
    b = a.replace("3x + 7 = 22", "5x + 2 = 47")
    shingles = {}
    for normalize in (True, False):
        cfg = config_from_dict({"steps": {"minhash": {"normalize_digits": normalize}}})
        sig = MinhashDedupSignature("/nonexistent-unused", minhash_config(cfg), language="en")
        shingles[normalize] = [set(sig.get_shingles(t).ravel().tolist()) for t in (a, b)]
    assert shingles[True][0] == shingles[True][1]
    assert shingles[False][0] != shingles[False][1]
    assert config_from_dict({"steps": {"minhash": {}}}).minhash_expectation()["normalize_digits"] is True
