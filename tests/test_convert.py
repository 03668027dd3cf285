"""parquet -> Megatron indexed dataset, on real parquet files, read back with megatron-core's reader."""

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kaiyuan_recipes.data.convert import MANIFEST, BadInputError, ConvertOptions, convert_directory
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

EOD = 151643


@pytest.fixture(scope="module")
def tokenizer_dir():
    return default_tokenizer_dir()


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def write_parquet(path, texts, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, **extra}), path, row_group_size=7)
    return path


def options(tmp_path, tokenizer_dir, **kw):
    base = dict(input_dir=tmp_path / "in", output_dir=tmp_path / "out", tokenizer_dir=tokenizer_dir,
                output_prefix="phase1", batch_size=5, num_shards=2, workers_per_shard=1)
    return ConvertOptions(**(base | kw))


def read_back(prefix):
    from kaiyuan_recipes import compat

    compat.apply()
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix))


def test_convert_writes_megatron_readable_shards(tmp_path, tokenizer_dir, hf_tokenizer):
    texts_a = [f"document {i}: the quick brown fox 狐狸 {i * 7}" for i in range(23)]
    texts_b = ["第二个文件。", "second file, second row", "x" * 5000]
    write_parquet(tmp_path / "in" / "a.parquet", texts_a, rank=list(range(23)))
    write_parquet(tmp_path / "in" / "sub" / "b.parquet", texts_b)
    result = convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert result["converted"] == 2
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == [MANIFEST, "phase1_part-00000_text_document.bin", "phase1_part-00000_text_document.idx",
                     "phase1_part-00000_text_document.rank.npy",  # a.parquet has a rank column, b.parquet none
                     "phase1_part-00001_text_document.bin", "phase1_part-00001_text_document.idx"]
    assert np.load(out / "phase1_part-00000_text_document.rank.npy").tolist() == list(range(23))
    for prefix, texts in (("phase1_part-00000_text_document", texts_a), ("phase1_part-00001_text_document", texts_b)):
        ds = read_back(out / prefix)
        assert len(ds) == len(texts)
        for i, text in enumerate(texts):
            expected = hf_tokenizer.encode(text, add_special_tokens=False).ids + [EOD]
            assert ds[i].tolist() == expected
        assert ds[0].dtype == np.int32
    manifest = json.loads((out / MANIFEST).read_text())
    shard = manifest["shards"]["phase1_part-00000_text_document"]
    assert shard["documents"] == 23 and shard["ranked"]
    assert not manifest["shards"]["phase1_part-00001_text_document"]["ranked"]
    assert shard["tokens"] == int(read_back(out / "phase1_part-00000_text_document").sequence_lengths.sum())
    assert shard["input_size"] == (tmp_path / "in" / "a.parquet").stat().st_size
    assert len(manifest["tokenizer_sha256"]) == 64


def test_rerun_skips_finished_and_redoes_stale(tmp_path, tokenizer_dir):
    write_parquet(tmp_path / "in" / "a.parquet", ["one", "two"])
    write_parquet(tmp_path / "in" / "b.parquet", ["three"])
    convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    again = convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert (again["converted"], again["up_to_date"]) == (0, 2)
    write_parquet(tmp_path / "in" / "b.parquet", ["three", "four"])  # input changed: stale
    os.utime(tmp_path / "in" / "b.parquet", ns=(1, 1))
    third = convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert (third["converted"], third["up_to_date"]) == (1, 1)
    assert len(read_back(tmp_path / "out" / "phase1_part-00001_text_document")) == 2


def test_a_relative_and_an_absolute_spelling_of_the_input_are_one_input(tmp_path, tokenizer_dir, monkeypatch):
    write_parquet(tmp_path / "in" / "a.parquet", ["one", "two"])
    write_parquet(tmp_path / "in" / "b.parquet", ["three"])
    monkeypatch.chdir(tmp_path)
    first = convert_directory(options(tmp_path, tokenizer_dir, input_dir=Path("in")), show_progress=False)
    assert first["converted"] == 2
    for spelling in (tmp_path / "in", Path("in"), Path("./in/../in")):
        again = convert_directory(options(tmp_path, tokenizer_dir, input_dir=spelling), show_progress=False)
        assert (again["converted"], again["up_to_date"]) == (0, 2), spelling
    # a manifest written before inputs were recorded absolute holds them as spelled: still up to date
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    for entry in manifest["shards"].values():
        entry["input"] = str(Path(entry["input"]).relative_to(tmp_path))
    (tmp_path / "out" / MANIFEST).write_text(json.dumps(manifest))
    again = convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert (again["converted"], again["up_to_date"]) == (0, 2)


def test_a_deleted_input_takes_its_shard_with_it_and_a_new_text_key_reconverts(tmp_path, tokenizer_dir):
    """Stale output never survives a rerun: the shard of a deleted input leaves disk and manifest (a blend of the
    directory would read its documents twice), and another --text-key is not 'up to date'."""
    write_parquet(tmp_path / "in" / "a.parquet", ["one", "two"], body=["uno", "dos"])
    write_parquet(tmp_path / "in" / "b.parquet", ["three"], body=["tres"])
    convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    (tmp_path / "in" / "a.parquet").unlink()  # b is now the first file: index 0
    result = convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    out = tmp_path / "out"
    assert result["removed"] == ["phase1_part-00001_text_document"] and result["converted"] == 1
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "phase1_part-00000_text_document.bin",
                                                     "phase1_part-00000_text_document.idx"]
    manifest = json.loads((out / MANIFEST).read_text())
    assert list(manifest["shards"]) == ["phase1_part-00000_text_document"]
    assert manifest["shards"]["phase1_part-00000_text_document"]["input"].endswith("b.parquet")
    assert manifest["shards"]["phase1_part-00000_text_document"]["documents"] == 1
    other = convert_directory(options(tmp_path, tokenizer_dir, text_key="body"), show_progress=False)
    assert (other["converted"], other["up_to_date"]) == (1, 0) and other["text_key"] == "body"
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode("tres", add_special_tokens=False).ids
    ds = read_back(out / "phase1_part-00000_text_document")  # held: its documents are views of its mmap
    assert ds[0].tolist() == ids + [EOD]


@pytest.mark.parametrize(
    "table, message",
    [
        (pa.table({"content": ["a"]}), "no column 'text' (columns: content)"),
        (pa.table({"text": ["ok", None, "ok"]}), "row 1 (0-based): 'text' is null"),
        (pa.table({"text": ["ok", "", "ok"]}), "row 1 (0-based): 'text' is empty"),
        (pa.table({"text": pa.array([b"ok", b"\xff\xfe bad"], pa.binary())}),
         "row 1 (0-based): 'text' is not valid UTF-8"),
        (pa.table({"text": pa.array([], pa.string())}), "the file has no rows"),
        (pa.table({"text": [1, 2]}), "column 'text' has type int64; expected string"),
    ],
)
def test_bad_input_names_file_and_row_and_leaves_nothing(tmp_path, tokenizer_dir, table, message):
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "bad.parquet")
    with pytest.raises(BadInputError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert "bad.parquet" in str(err.value)
    leftovers = [p.name for p in (tmp_path / "out").iterdir() if p.suffix in (".bin", ".idx")]
    assert leftovers == []


def test_truncated_parquet(tmp_path, tokenizer_dir):
    path = write_parquet(tmp_path / "in" / "a.parquet", [f"row {i} " * 50 for i in range(100)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInputError, match="a.parquet: not a readable parquet file"):
        convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    assert not list((tmp_path / "out").glob("*.bin"))


def test_skip_policy_counts_and_reports(tmp_path, tokenizer_dir):
    write_parquet(tmp_path / "in" / "a.parquet", ["good one", None, "", "good two"])
    result = convert_directory(options(tmp_path, tokenizer_dir, on_bad_row="skip"), show_progress=False)
    shard = result["shards"]["phase1_part-00000_text_document"]
    assert shard["skipped_rows"] == 2 and shard["documents"] == 2
    assert "row 1 (0-based): 'text' is null" in shard["skipped_examples"][0]
    assert len(read_back(tmp_path / "out" / "phase1_part-00000_text_document")) == 2


def test_one_bad_file_keeps_the_good_ones(tmp_path, tokenizer_dir):
    write_parquet(tmp_path / "in" / "a.parquet", ["fine"])
    write_parquet(tmp_path / "in" / "b.parquet", ["fine", None])
    with pytest.raises(BadInputError, match=r"b.parquet: row 1.*\(1 of 2 files failed"):
        convert_directory(options(tmp_path, tokenizer_dir), show_progress=False)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert list(manifest["shards"]) == ["phase1_part-00000_text_document"]


def test_a_file_whose_every_row_is_skipped_is_named_and_the_good_shards_are_recorded(tmp_path, tokenizer_dir):
    """--on-bad-row skip over a file of bad rows only: an empty shard could not be read back ("cannot mmap an empty
    file", no file named) and the good file's finished shard went unrecorded."""
    write_parquet(tmp_path / "in" / "a.parquet", ["fine"])
    write_parquet(tmp_path / "in" / "b.parquet", [None, ""])  # null and empty: both bad rows
    with pytest.raises(BadInputError, match=r"b.parquet: all 2 rows skipped as bad, nothing to convert \(.*row 0"):
        convert_directory(options(tmp_path, tokenizer_dir, on_bad_row="skip"), show_progress=False)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert list(manifest["shards"]) == ["phase1_part-00000_text_document"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []  # no temporaries


def test_cli_convert_and_inspect(tmp_path, tokenizer_dir):
    import subprocess
    import sys

    write_parquet(tmp_path / "in" / "a.parquet", ["hello world", "你好"], rank=[1, 2])
    cmd = [sys.executable, "-m", "kaiyuan_recipes.cli.main"]
    out = subprocess.run(cmd + ["data", "convert", "--input-dir", str(tmp_path / "in"),
                                "--output-dir", str(tmp_path / "out"),
                                "--tokenizer", str(tokenizer_dir), "--output-prefix", "phase3", "--num-shards", "1",
                                "--workers-per-shard", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 documents" in out.stdout and (tmp_path / "out" / "phase3_part-00000_text_document.idx").is_file()
    out = subprocess.run(cmd + ["data", "inspect", "--json", str(tmp_path / "in" / "a.parquet")],
                         capture_output=True, text=True)
    report = json.loads(out.stdout)[0]
    assert report["rows"] == 2 and report["has_rank_column"] and report["schema"]["rank"] == "int64"
    assert report["text_stats"]["chars_max"] == 11 and report["sample_row"]["text"] == "hello world"
    out = subprocess.run(cmd + ["data", "inspect", str(tmp_path / "missing.parquet")], capture_output=True, text=True)
    assert out.returncode == 1 and "missing.parquet" in out.stderr and "Traceback" not in out.stderr


def test_tiktoken_and_tokenizers_paths_give_identical_shards(tmp_path, tokenizer_dir):
    """The bundled tokenizer is encoded with tiktoken; any other directory with `tokenizers`.
    A copy whose tokenizer.json differs only by one extra special token takes the second path."""
    from kaiyuan_recipes.data.encoders import is_bundled_qwen2_bpe

    other = tmp_path / "other_tok"
    other.mkdir()
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": 151646, "content": "<|extra_special|>"})
    (other / "tokenizer.json").write_text(json.dumps(spec))
    assert is_bundled_qwen2_bpe(str(tokenizer_dir)) and not is_bundled_qwen2_bpe(str(other))
    # Recent combining marks (U+1DF6 U+1DF7) are ordered differently by Python's Unicode tables and `tokenizers`'.
    texts = ["Ca\u0301fe\u0301 naïve 1234 🎉", "<|im_start|>user 你好<|im_end|>", "  spaces   and\ttabs\n\n",
             "混合 text", "\u1df6\u1df7", "a\u1df6\u0301b", "\u1df9\u0300 \U0001FAE8 \u0CF3 \U00011F00",
             "ﬁ ① Å Ω ｆｕｌｌ"]
    write_parquet(tmp_path / "in" / "a.parquet", texts)
    fast = convert_directory(options(tmp_path, tokenizer_dir, output_dir=tmp_path / "fast"), show_progress=False)
    slow = convert_directory(options(tmp_path, other, output_dir=tmp_path / "slow"), show_progress=False)
    assert fast["shards"]["phase1_part-00000_text_document"]["encoder"] == "tiktoken"
    assert slow["shards"]["phase1_part-00000_text_document"]["encoder"] == "tokenizers"
    a = read_back(tmp_path / "fast" / "phase1_part-00000_text_document")
    b = read_back(tmp_path / "slow" / "phase1_part-00000_text_document")
    assert [a[i].tolist() for i in range(len(a))] == [b[i].tolist() for i in range(len(b))]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_convert_stops_its_workers_and_keeps_only_what_finished(tmp_path, sig, code):
    """SIGTERM / Ctrl-C: the workers stop (none stays resident), finished shards are in the manifest, nothing
    is left under a final name the manifest does not know, no temporary file stays, exit 143 / 130."""
    import subprocess
    import sys

    for i in range(6):
        write_parquet(tmp_path / "in" / f"f{i}.parquet", [f"row {j} " * 300 for j in range(4000)])
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "convert", "--input-dir",
                             str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--output-prefix", "p",
                             "--num-shards", "2", "--workers-per-shard", "1", "--batch-size", "50"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list((tmp_path / "out").glob(".p_part-*.tmp.bin")) and time.monotonic() < deadline:
        time.sleep(0.05)  # a shard is being written
    workers = _descendants(proc.pid)  # the forkserver and its workers
    assert len(workers) >= 3, workers
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert "stopped by signal" in err and "Traceback" not in err
    out = tmp_path / "out"
    recorded = set(json.loads((out / MANIFEST).read_text())["shards"]) if (out / MANIFEST).is_file() else set()
    on_disk = {p.name.rsplit(".", 1)[0] for p in out.iterdir() if p.suffix in (".bin", ".idx")}
    assert on_disk == recorded and len(recorded) < 6
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "workers outlived the driver"
    again = convert_directory(options(tmp_path, default_tokenizer_dir(), output_prefix="p", num_shards=2),
                              show_progress=False)
    assert again["converted"] == 6 - len(recorded) and len(again["shards"]) == 6



def test_a_corrupt_page_is_reported_with_its_row_group_and_rows(tmp_path, tokenizer_dir):
    path = tmp_path / "in" / "a.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(500)]}), path, row_group_size=100,
                   compression="none")
    column = pq.ParquetFile(path).metadata.row_group(3).column(0)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset
    data[start:start + 64] = b"\xff" * 64  # the page header of row group 3 (rows 300-399)
    path.write_bytes(bytes(data))
    with pytest.raises(BadInputError, match=r"a.parquet: corrupt or truncated parquet in row group 3 "
                                            r"\(rows 300-399, 0-based"):
        convert_directory(options(tmp_path, tokenizer_dir, batch_size=1000), show_progress=False)
    assert not [p for p in (tmp_path / "out").iterdir() if p.suffix in (".bin", ".idx") or p.name.startswith(".")]


def test_a_full_disk_or_an_unwritable_output_is_one_clear_error_and_leaves_no_temp_file(tmp_path, tokenizer_dir):
    """ENOSPC from a real device (/dev/full behind the shard's temporary name) and an output directory that
    cannot be created: one line naming the path and the cause; nothing half-written stays."""
    write_parquet(tmp_path / "in" / "a.parquet", [f"doc {i} " * 200 for i in range(200)])
    out = tmp_path / "out"
    out.mkdir()
    (out / ".phase1_part-00000_text_document.tmp.bin").symlink_to("/dev/full")
    from kaiyuan_recipes.data.convert import OutputError

    with pytest.raises(OutputError, match=r"out: cannot write the shard of a.parquet \(No space left on device\)"):
        convert_directory(options(tmp_path, tokenizer_dir, num_shards=1), show_progress=False)
    assert [p.name for p in out.iterdir()] in ([], [MANIFEST])

    with pytest.raises(OutputError, match="/proc/1/kaiyuan-out: cannot create the output directory"):
        convert_directory(options(tmp_path, tokenizer_dir, output_dir=Path("/proc/1/kaiyuan-out")), show_progress=False)


def test_inspect_reports_every_file_with_the_same_exit_code_for_table_and_json(tmp_path):
    """An integer or binary text column, a corrupt page, a file that is no parquet: each reported, none a
    traceback, the good file still reported, and --json exits non-zero like the table."""
    import subprocess
    import sys

    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "int.parquet")
    pq.write_table(pa.table({"text": pa.array([b"\xff"], pa.binary())}), tmp_path / "bin.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["ok " * 20] * 500}), good, row_group_size=100, compression="none")
    data = bytearray(good.read_bytes())
    start = pq.ParquetFile(good).metadata.row_group(2).column(0).data_page_offset
    data[start:start + 64] = b"\xff" * 64
    (tmp_path / "corrupt.parquet").write_bytes(bytes(data))
    (tmp_path / "none.parquet").write_text("x")
    paths = [str(tmp_path / n)
             for n in ("int.parquet", "bin.parquet", "corrupt.parquet", "none.parquet", "good.parquet")]
    codes = []
    for extra in ([], ["--json"]):
        run = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "inspect", *paths, "--full",
                              *extra], capture_output=True, text=True, timeout=300)
        assert "Traceback" not in run.stdout + run.stderr
        codes.append(run.returncode)
    assert codes == [1, 1]
    errors = {Path(r["path"]).name: r.get("error") for r in json.loads(run.stdout)}
    assert "type int64; expected string" in errors["int.parquet"] and "type binary" in errors["bin.parquet"]
    assert "unreadable data after 200 rows" in errors["corrupt.parquet"]
    assert "not a readable parquet file" in errors["none.parquet"] and errors["good.parquet"] is None


def test_workers_of_a_sigkilled_driver_stop(tmp_path):
    """After SIGKILL of `kaiyuan data convert` its workers notice (their forkserver's death reaches them as
    PR_SET_PDEATHSIG's SIGTERM, and they watch the driver) and exit within seconds instead of converting the
    queue for nobody; what they had half-written is never under a final name."""
    import subprocess
    import sys

    for i in range(6):
        write_parquet(tmp_path / "in" / f"f{i}.parquet", [f"row {j} " * 300 for j in range(4000)])
    proc = subprocess.Popen([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "convert", "--input-dir",
                             str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--output-prefix", "p",
                             "--num-shards", "2", "--workers-per-shard", "1", "--batch-size", "50"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not list((tmp_path / "out").glob(".p_part-*.tmp.bin")) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = _descendants(proc.pid)
    proc.kill()
    proc.wait()
    # A bound far above the stop's (a poll and the 2 s grace), far below the 30 s a stuck shard once had.
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers and not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "workers outlived the driver"
    out = tmp_path / "out"
    recorded = set(json.loads((out / MANIFEST).read_text())["shards"]) if (out / MANIFEST).is_file() else set()
    assert {p.name.rsplit(".", 1)[0] for p in out.iterdir() if p.suffix in (".bin", ".idx")} <= recorded


def test_a_rerun_never_removes_another_prefixs_shards(tmp_path, tokenizer_dir):
    """Two datasets converted into one output directory under different prefixes: neither run removes the other's."""
    write_parquet(tmp_path / "in" / "a.parquet", ["one"])
    write_parquet(tmp_path / "in2" / "b.parquet", ["two"])
    convert_directory(options(tmp_path, tokenizer_dir, output_prefix="en"), show_progress=False)
    result = convert_directory(options(tmp_path, tokenizer_dir, input_dir=tmp_path / "in2", output_prefix="zh"),
                               show_progress=False)
    assert result["removed"] == [] and set(result["shards"]) == {"en_part-00000_text_document",
                                                                  "zh_part-00000_text_document"}
    assert (tmp_path / "out" / "en_part-00000_text_document.bin").is_file()


def _descendants(root):
    """Every process below `root` now (the converter's forkserver and workers)."""
    from kaiyuan_recipes.processes import processes

    table = processes()
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, p in table.items() if p.ppid == parent]
        found += kids
        todo += kids
    return found


def test_converting_in_process_gives_the_workers_shards_and_records_each_as_it_finishes(tmp_path, tokenizer_dir):
    """The bundled sample corpus is converted by the calling process (starting workers costs more than it): the
    same bytes and manifest entries as the workers' conversion; a failure in the second file keeps the first."""
    write_parquet(tmp_path / "in" / "a.parquet", [f"doc {i}: 狐狸 fox" * 5 for i in range(40)])
    write_parquet(tmp_path / "in" / "b.parquet", ["second", "file"])
    workers = convert_directory(options(tmp_path, tokenizer_dir, output_dir=tmp_path / "w"), show_progress=False)
    here = convert_directory(options(tmp_path, tokenizer_dir, output_dir=tmp_path / "h", in_process=True),
                             show_progress=False)
    assert here["converted"] == workers["converted"] == 2
    for name in sorted(workers["shards"]):
        for ext in (".bin", ".idx"):
            assert (tmp_path / "h" / f"{name}{ext}").read_bytes() == (tmp_path / "w" / f"{name}{ext}").read_bytes()
        assert ({k: v for k, v in here["shards"][name].items() if k not in ("prefix", "seconds")}
                == {k: v for k, v in workers["shards"][name].items() if k not in ("prefix", "seconds")})
    write_parquet(tmp_path / "in2" / "a.parquet", ["fine"])
    write_parquet(tmp_path / "in2" / "b.parquet", [None])
    with pytest.raises(BadInputError, match="b.parquet"):
        convert_directory(options(tmp_path, tokenizer_dir, input_dir=tmp_path / "in2", output_dir=tmp_path / "h2",
                                  in_process=True), show_progress=False)
    assert list(json.loads((tmp_path / "h2" / MANIFEST).read_text())["shards"]) == ["phase1_part-00000_text_document"]
    assert not list((tmp_path / "h2").glob(".*tmp*"))
