"""parquet → Megatron indexed dataset (.bin/.idx), one output prefix per input file.

Each input file is converted by one process that streams record batches (memory stays flat),
tokenizes them on M threads (kaiyuan_recipes.data.encoders), appends EOD, and writes through
megatron-core's IndexedDatasetBuilder under a temporary name that is renamed when complete.
N files run at once. A manifest per output directory records what each output was made from, so
finished shards are skipped on a re-run and stale ones (input or tokenizer changed) are redone."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.data.encoders import make_batch_encoder
from kaiyuan_recipes.data.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size

MANIFEST = "manifest.json"
BAD_ROW_POLICIES = ("error", "skip")


class BadInputError(ValueError):
    pass


@dataclass
class ConvertOptions:
    input_dir: Path
    output_dir: Path
    tokenizer_dir: Path
    output_prefix: str
    text_key: str = "text"
    num_shards: int = 0          # 0: sized to the cores
    workers_per_shard: int = 0   # 0: sized to the cores
    batch_size: int = 1000
    on_bad_row: str = "error"
    append_eod: bool = True

    def resolved_parallelism(self, n_files: int) -> tuple[int, int]:
        cores = os.cpu_count() or 1
        shards = self.num_shards or max(1, min(n_files, cores))
        workers = self.workers_per_shard or max(1, cores // shards)
        return shards, workers


@dataclass
class ShardResult:
    input: str
    input_size: int
    input_mtime_ns: int
    prefix: str
    documents: int = 0
    tokens: int = 0
    skipped_rows: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    encoder: str = ""


def output_prefix_for(opts: ConvertOptions, index: int) -> Path:
    # The original scripts' names, so existing blends keep working.
    return opts.output_dir / f"{opts.output_prefix}_part-{index:05d}_text_document"


def list_parquet_files(input_dir: Path) -> list[Path]:
    input_dir = Path(input_dir)
    if not input_dir.is_dir():
        raise BadInputError(f"{input_dir}: input directory not found")
    files = sorted(p for p in input_dir.rglob("*.parquet") if p.is_file())
    if not files:
        raise BadInputError(f"{input_dir}: no *.parquet files")
    return files


# ---- worker side ---------------------------------------------------------------------------------


def _bad(result: ShardResult, path: Path, row: int, why: str, policy: str) -> None:
    message = f"{path}: row {row}: {why}"
    if policy == "error":
        raise BadInputError(message)
    result.skipped_rows += 1
    if len(result.skipped_examples) < 5:
        result.skipped_examples.append(message)


def _texts_of(batch: Any, column: str, path: Path, first_row: int, result: ShardResult, policy: str) -> list[str]:
    import pyarrow as pa

    array = batch.column(column)
    texts: list[str] = []
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        values = array.to_pylist()
        for i, raw in enumerate(values):
            if raw is None:
                _bad(result, path, first_row + i, f"'{column}' is null", policy)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                _bad(result, path, first_row + i, f"'{column}' is not valid UTF-8 ({err.reason} at byte {err.start})", policy)
                continue
            if not text:
                _bad(result, path, first_row + i, f"'{column}' is empty", policy)
                continue
            texts.append(text)
        return texts
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise BadInputError(f"{path}: column '{column}' has type {array.type}; expected string")
    values = array.to_pylist()
    if array.null_count == 0 and all(values):
        return values
    for i, text in enumerate(values):
        if text is None:
            _bad(result, path, first_row + i, f"'{column}' is null", policy)
        elif not text:
            _bad(result, path, first_row + i, f"'{column}' is empty", policy)
        else:
            texts.append(text)
    return texts


def convert_parquet_shard(path: str, prefix: str, opts_dict: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """Convert one parquet file into `<prefix>.bin/.idx`. Runs in a worker process."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

    opts = ConvertOptions(**opts_dict)
    src, prefix_path = Path(path), Path(prefix)
    stat = src.stat()
    result = ShardResult(str(src), stat.st_size, stat.st_mtime_ns, str(prefix_path))
    start = time.perf_counter()
    threads = int(os.environ.get("RAYON_NUM_THREADS", "1"))
    encode, eod, result.encoder = make_batch_encoder(Path(opts.tokenizer_dir), threads)
    if opts.append_eod and eod is None:
        raise BadInputError(f"{opts.tokenizer_dir}: tokenizer has no <|endoftext|> token for EOD")
    dtype = DType.optimal_dtype(tokenizer_vocab_size(Path(opts.tokenizer_dir)))

    try:
        parquet = pq.ParquetFile(src)
    except (pa.ArrowInvalid, OSError) as err:
        raise BadInputError(f"{src}: not a readable parquet file ({err})") from err
    if opts.text_key not in parquet.schema_arrow.names:
        raise BadInputError(f"{src}: no column '{opts.text_key}' (columns: {', '.join(parquet.schema_arrow.names)})")
    if parquet.metadata.num_rows == 0:
        raise BadInputError(f"{src}: the file has no rows")

    # Hidden temporary prefix in the same directory: readable by IndexedDataset, renamed when whole.
    tmp_prefix = prefix_path.with_name(f".{prefix_path.name}.tmp")
    tmp_bin, tmp_idx = Path(f"{tmp_prefix}.bin"), Path(f"{tmp_prefix}.idx")
    builder = IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
    tail = [eod] if opts.append_eod else []

    def write(encoded: list[list[int]]) -> None:
        for ids in encoded:
            doc = np.array(ids + tail, dtype=dtype)
            builder.add_document(torch.from_numpy(doc), [doc.size])
            result.tokens += doc.size
        result.documents += len(encoded)

    row = 0
    try:
        # One batch is encoded (GIL released) while the previous one is written.
        with ThreadPoolExecutor(max_workers=1) as encoder_thread:
            pending = None
            for batch in parquet.iter_batches(batch_size=opts.batch_size, columns=[opts.text_key]):
                texts = _texts_of(batch, opts.text_key, src, row, result, opts.on_bad_row)
                row += batch.num_rows
                submitted = encoder_thread.submit(encode, texts)
                if pending is not None:
                    write(pending.result())
                pending = submitted
                if progress is not None:
                    progress.put(batch.num_rows)
            if pending is not None:
                write(pending.result())
    except (pa.ArrowInvalid, OSError) as err:
        builder.data_file.close()
        tmp_bin.unlink(missing_ok=True)
        raise BadInputError(f"{src}: corrupt or truncated parquet near row {row} ({err})") from err
    except BaseException:
        builder.data_file.close()
        tmp_bin.unlink(missing_ok=True)
        raise
    builder.finalize(str(tmp_idx))
    # Read it back with megatron-core's own reader before it gets its final name.
    check = IndexedDataset(str(tmp_prefix))
    if len(check) != result.documents or int(check.sequence_lengths.sum()) != result.tokens:
        raise BadInputError(f"{src}: read-back mismatch ({len(check)} docs / {result.documents} written)")
    del check
    os.replace(tmp_bin, prefix_path.with_name(prefix_path.name + ".bin"))
    os.replace(tmp_idx, prefix_path.with_name(prefix_path.name + ".idx"))
    result.seconds = time.perf_counter() - start
    return asdict(result)


# ---- driver side ---------------------------------------------------------------------------------


def load_manifest(output_dir: Path) -> dict[str, Any]:
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return {"shards": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def _write_manifest(output_dir: Path, manifest: dict[str, Any]) -> None:
    write_text_atomic(Path(output_dir) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def is_up_to_date(entry: dict[str, Any] | None, src: Path, prefix: Path) -> bool:
    """Same input file (size, mtime) and both outputs present. A tokenizer change has already
    emptied the manifest's shards (convert_directory)."""
    if not entry:
        return False
    stat = src.stat()
    return (
        entry["input_size"] == stat.st_size
        and entry["input_mtime_ns"] == stat.st_mtime_ns
        and Path(f"{prefix}.bin").is_file()
        and Path(f"{prefix}.idx").is_file()
    )


_PROGRESS = None


def _init_worker(threads: int, progress: Any) -> None:
    # The Rust tokenizer's thread pool reads this once, at first use in the process.
    global _PROGRESS
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _PROGRESS = progress


def _convert_in_worker(path: str, prefix: str, opts_dict: dict[str, Any]) -> dict[str, Any]:
    return convert_parquet_shard(path, prefix, opts_dict, _PROGRESS)


def convert_directory(opts: ConvertOptions, show_progress: bool = True) -> dict[str, Any]:
    """Convert every parquet file under opts.input_dir; returns the manifest."""
    import pyarrow.parquet as pq

    if opts.on_bad_row not in BAD_ROW_POLICIES:
        raise BadInputError(f"--on-bad-row: expected one of {BAD_ROW_POLICIES}, got {opts.on_bad_row!r}")
    files = list_parquet_files(opts.input_dir)
    opts.output_dir = Path(opts.output_dir)
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_sha = tokenizer_fingerprint(opts.tokenizer_dir)
    manifest = load_manifest(opts.output_dir)
    if manifest.get("tokenizer_sha256") not in (None, tokenizer_sha):
        manifest["shards"] = {}  # a different tokenizer makes every output stale
    manifest.update(
        tokenizer_sha256=tokenizer_sha, tokenizer_dir=str(opts.tokenizer_dir), text_key=opts.text_key,
        append_eod=opts.append_eod, input_dir=str(opts.input_dir),
    )
    todo = []
    for index, src in enumerate(files):
        prefix = output_prefix_for(opts, index)
        if not is_up_to_date(manifest["shards"].get(prefix.name), src, prefix):
            todo.append((src, prefix))
    shards, workers = opts.resolved_parallelism(len(todo) or 1)
    skipped_up_to_date = len(files) - len(todo)
    if not todo:
        _write_manifest(opts.output_dir, manifest)
        return manifest | {"converted": 0, "up_to_date": skipped_up_to_date}

    total_rows = 0
    for src, _ in todo:
        try:
            total_rows += pq.ParquetFile(src).metadata.num_rows
        except Exception:  # reported properly by the worker, with the file name
            pass
    # forkserver: workers fork from a clean single-threaded server that has imported the heavy
    # modules (torch, megatron-core) once. Plain fork is unsafe from a process that already runs
    # threads (a training process, a test runner); spawn would repeat the imports in every worker.
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["megatron.core.datasets.indexed_dataset", "pyarrow.parquet", "kaiyuan_recipes.data.encoders"])
    progress_queue = ctx.Queue()
    opts_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                   TimeRemainingColumn(), disable=not show_progress)
    started = time.perf_counter()
    failures: list[str] = []
    with bar, ProcessPoolExecutor(max_workers=shards, mp_context=ctx, initializer=_init_worker,
                                  initargs=(workers, progress_queue)) as pool:
        task = bar.add_task("rows", total=total_rows)
        futures = {pool.submit(_convert_in_worker, str(src), str(prefix), opts_dict): prefix for src, prefix in todo}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            while not progress_queue.empty():
                bar.advance(task, progress_queue.get_nowait())
            for fut in done:
                prefix = futures[fut]
                try:
                    result = fut.result()
                except BadInputError as err:
                    failures.append(str(err))
                    continue
                manifest["shards"][prefix.name] = result
                _write_manifest(opts.output_dir, manifest)  # a finished shard is never redone
    elapsed = time.perf_counter() - started
    if failures:
        raise BadInputError("; ".join(failures) + f" ({len(failures)} of {len(todo)} files failed; the others are kept)")
    return manifest | {"converted": len(todo), "up_to_date": skipped_up_to_date, "seconds": elapsed,
                       "num_shards": shards, "workers_per_shard": workers}
