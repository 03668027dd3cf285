"""Input checks of a cleaning run. Bad rows (a null text, invalid UTF-8, a text over --max-document-bytes) are
handled per row by the reader, before Python or a tokenizer sees the text: refused naming the file and row
(`--on-bad-row error`, nothing left behind), or skipped and counted in the manifest (`skip`). A document longer than
the length step's max_chars is never tokenized. A run that removes every document exits non-zero with the per-step
counts. An output is "already cleaned" only for inputs of the same content."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.data.clean.inputs import BadRowError, staging_dir_for
from kaiyuan_recipes.data.clean.run import CleanOptions, clean_directory

PROSE = ("The council measured the old bridge in the spring, and the engineers said that it would carry the "
         "trains of the northern line for many years to come. ")


def quiet(*_):
    pass


def strings_with_bytes(values: list[bytes | None]) -> pa.Array:
    """A string array holding these bytes as they are (pyarrow checks no UTF-8 when built from buffers)."""
    offsets, data, valid = [0], b"", []
    for v in values:
        data += v or b""
        offsets.append(len(data))
        valid.append(v is not None)
    mask = pa.array(valid).buffers()[1] if not all(valid) else None
    return pa.Array.from_buffers(pa.string(), len(values), [mask, pa.array(offsets, pa.int32()).buffers()[1],
                                                            pa.py_buffer(data)])


def write_inputs(raw: Path, bad: dict[int, bytes | None], rows: int = 12, big: int = 4000) -> list[str]:
    """raw/a.parquet clean; raw/b.parquet with the bad texts at the given rows; returns every good text."""
    raw.mkdir(parents=True)
    good = []
    for name, bad_rows in (("a", {}), ("b", bad)):
        values = []
        for i in range(rows):
            if i in bad_rows:
                values.append(bad_rows[i])
            else:
                text = f"{name}{i}: " + PROSE * (3 + i % 4)
                values.append(text.encode())
                good.append(text)
        pq.write_table(pa.table({"id": [f"{name}{i}" for i in range(rows)], "text": strings_with_bytes(values)}),
                       raw / f"{name}.parquet", row_group_size=5)
    return good


def length_only(tmp: Path, max_chars: int = 100_000) -> str:
    path = tmp / "length.yaml"
    path.write_text(json.dumps({"count_tokens": True, "steps": {"length": {"min_chars": 100, "max_chars": max_chars}}}))
    return str(path)


BAD = {3: b"caf\xe9 au lait " * 20, 7: b"x" * 5000, 9: None}


def test_a_bad_row_stops_the_run_naming_file_and_row_and_leaves_nothing(tmp_path):
    write_inputs(tmp_path / "raw", {3: BAD[3]})
    out = tmp_path / "out"
    with pytest.raises(BadRowError) as err:
        clean_directory(CleanOptions(tmp_path / "raw", out, length_only(tmp_path), workers=1), log=quiet)
    assert f"{tmp_path / 'raw' / 'b.parquet'}: row 3 (0-based): column 'text' is not valid UTF-8" in str(err.value)
    assert "--on-bad-row skip" in str(err.value)
    assert not out.exists() and not staging_dir_for(out).exists()


def test_an_oversized_row_is_named_with_its_size(tmp_path):
    write_inputs(tmp_path / "raw", {7: BAD[7]})
    with pytest.raises(BadRowError, match=r"b\.parquet: row 7 \(0-based\): column 'text' holds 5,000 bytes, over the "
                                          r"limit of 4,096 \(--max-document-bytes\)"):
        clean_directory(CleanOptions(tmp_path / "raw", tmp_path / "out", length_only(tmp_path), workers=1,
                                     max_document_bytes=4096), log=quiet)


def test_skipped_bad_rows_are_counted_and_the_rest_cleaned(tmp_path):
    good = write_inputs(tmp_path / "raw", BAD)
    out = tmp_path / "out"
    manifest = clean_directory(CleanOptions(tmp_path / "raw", out, length_only(tmp_path, max_chars=600),
                                            workers=1, on_bad_row="skip", max_document_bytes=4096), log=quiet)
    assert manifest["bad_rows_skipped"] == {"invalid_utf8": 1, "null": 1, "too_large": 1}
    assert manifest["rows_in"] == 24 and manifest["documents_in"] == 21 and manifest["empty_text_rows"] == 0
    kept = [t for p in sorted(out.glob("*.parquet")) for t in pq.read_table(p).column("text").to_pylist()]
    assert sorted(kept) == sorted(t for t in good if len(t) <= 600)
    # the documents over max_chars went uncounted by the tokenizer and were removed by the length step
    too_long = sum(len(t) > 600 for t in good)
    assert too_long and manifest["documents_too_long_to_count"] == too_long
    assert manifest["steps"][0]["removed_by_reason"] == {"too_long": too_long}


def test_a_long_document_is_not_tokenized(tmp_path):
    """The token counter passes a document over max_chars through uncounted (the length step removes it next)."""
    from datatrove.data import Document

    from kaiyuan_recipes.data.clean.steps import BoundedTokensCounter
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    counter = BoundedTokensCounter(str(default_tokenizer_dir() / "tokenizer.json"), 4, max_chars=100)
    docs = [Document("short text " * 3, "a"), Document("long " * 1000, "b"), Document("tiny", "c")]
    seen = {}
    encode = counter.tokenizer.encode_batch
    counter.tokenizer.encode_batch = lambda texts: seen.setdefault("texts", texts) and encode(texts)
    out = list(counter.run(iter(docs)))
    assert [d.id for d in out] == ["a", "b", "c"]
    assert "token_count" not in out[1].metadata and out[0].metadata["token_count"] > 0
    assert seen["texts"] == ["short text " * 3, "tiny"]
    assert counter.stats["documents_too_long_to_count"].total == 1


def test_a_run_that_removes_everything_exits_non_zero_with_the_counts(tmp_path, capsys):
    from kaiyuan_recipes.cli.main import main

    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"text": [f"too short {i}" for i in range(40)]}), raw / "a.parquet")
    code = main(["data", "clean", "--input-dir", str(raw), "--output-dir", str(tmp_path / "out"),
                 "--config", length_only(tmp_path), "--workers", "1"])
    captured = capsys.readouterr()
    assert code == 1
    assert "length             documents 40 -> 0" in captured.out and "(too_short 40)" in captured.out
    assert "every document was removed" in captured.err


def test_already_cleaned_is_decided_by_content_not_size_and_rows(tmp_path):
    """An input edited in place (same path, size and row count, another text) is not "already cleaned"."""
    from kaiyuan_recipes.data.clean.inputs import CleanInputError

    raw = tmp_path / "raw"
    raw.mkdir()

    def write(word: str) -> None:
        texts = [f"{word} {i:03d} " + PROSE * 2 for i in range(20)]
        pq.write_table(pa.table({"text": texts}), raw / "a.parquet", compression="none", use_dictionary=False,
                       write_statistics=False)

    write("alpha")
    config, out = length_only(tmp_path), tmp_path / "out"
    clean_directory(CleanOptions(raw, out, config, workers=1), log=quiet)
    before = (raw / "a.parquet").stat().st_size
    assert clean_directory(CleanOptions(raw, out, config, workers=1), log=quiet)["up_to_date"]
    write("gamma")
    assert (raw / "a.parquet").stat().st_size == before and pq.ParquetFile(raw / "a.parquet").metadata.num_rows == 20
    with pytest.raises(CleanInputError, match="holds the cleaning of another input or config"):
        clean_directory(CleanOptions(raw, out, config, workers=1), log=quiet)
