"""parquet → Megatron indexed dataset (.bin/.idx), one output prefix per input file.

Each input file is converted by one process that streams record batches (memory stays flat),
tokenizes them on M threads (kaiyuan_recipes.data.encoders), appends EOD, and writes through
megatron-core's IndexedDatasetBuilder under a temporary name that is renamed when complete.
N files run at once. A manifest per output directory records what each output was made from, so
finished shards are skipped on a re-run and stale ones (input or tokenizer changed) are redone."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Iterator

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.data.encoders import make_batch_encoder
from kaiyuan_recipes.data.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size

MANIFEST = "manifest.json"
BAD_ROW_POLICIES = ("error", "skip")


class BadInputError(ValueError):
    pass


class OutputError(RuntimeError):
    """The output cannot be written (a full or read-only disk, no permission); temporary files are removed."""


OUTPUT_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG}


class ConversionInterrupted(Exception):
    """SIGINT / SIGTERM stopped the conversion: finished shards are in the manifest, nothing else was kept."""

    def __init__(self, signum: int, finished: int, stopped: int):
        self.signum = signum
        super().__init__(f"stopped by signal {signum}: {finished} shard(s) finished and recorded, {stopped} not "
                         "written (a rerun converts them)")


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
    message = f"{path}: row {row} (0-based): {why}"
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
                _bad(result, path, first_row + i,
                     f"'{column}' is not valid UTF-8 ({err.reason} at byte {err.start})", policy)
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
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

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
    try:
        builder = IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
    except OSError as err:
        tmp_bin.unlink(missing_ok=True)
        raise OutputError(f"{tmp_bin.parent}: cannot write the shard of {src.name} ({err.strerror})") from None
    tail = [eod] if opts.append_eod else []

    def write(encoded: list[list[int]]) -> None:
        for ids in encoded:
            doc = np.array(ids + tail, dtype=dtype)
            builder.add_document(torch.from_numpy(doc), [doc.size])
            result.tokens += doc.size
        result.documents += len(encoded)

    row, group, group_first = 0, 0, 0
    try:
        # One batch is encoded (GIL released) while the previous one is written. Row group by row group, so a
        # corrupt page is reported with the rows it holds.
        with ThreadPoolExecutor(max_workers=1) as encoder_thread:
            pending = None
            for group in range(parquet.metadata.num_row_groups):
                group_first = row
                for batch in parquet.iter_batches(batch_size=opts.batch_size, columns=[opts.text_key],
                                                  row_groups=[group]):
                    if _should_stop():
                        raise _Stopped(str(src))
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
    except OSError as err:
        _discard(builder, tmp_bin)
        if err.errno in OUTPUT_ERRNOS:
            raise OutputError(f"{tmp_bin.parent}: cannot write the shard of {src.name} ({err.strerror})") from None
        raise _corrupt(src, parquet, group, group_first, row, err) from err
    except pa.ArrowInvalid as err:
        _discard(builder, tmp_bin)
        raise _corrupt(src, parquet, group, group_first, row, err) from err
    except BaseException:
        _discard(builder, tmp_bin)
        raise
    try:
        _finish_shard(builder, tmp_prefix, prefix_path, result, src)
    except BaseException as err:
        for path in (tmp_bin, tmp_idx):
            path.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputError(f"{prefix_path.parent}: cannot write the shard of {src.name} ({err.strerror})") from None
        raise
    result.seconds = time.perf_counter() - start
    return asdict(result)


def _discard(builder: Any, tmp_bin: Path) -> None:
    """Close and remove a half-written shard; closing flushes, which fails again on a full disk."""
    try:
        builder.data_file.close()
    except OSError:
        pass
    tmp_bin.unlink(missing_ok=True)


def _corrupt(src: Path, parquet: Any, group: int, group_first: int, row: int, err: Exception) -> BadInputError:
    rows = parquet.metadata.row_group(group).num_rows
    return BadInputError(f"{src}: corrupt or truncated parquet in row group {group} (rows {group_first}-"
                         f"{group_first + rows - 1}, 0-based; read up to row {row}) ({err})")


def _finish_shard(builder: Any, tmp_prefix: Path, prefix_path: Path, result: ShardResult, src: Path) -> None:
    """The index, a read-back with megatron-core's own reader, then the final names."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tmp_bin, tmp_idx = Path(f"{tmp_prefix}.bin"), Path(f"{tmp_prefix}.idx")
    builder.finalize(str(tmp_idx))
    check = IndexedDataset(str(tmp_prefix))
    if len(check) != result.documents or int(check.sequence_lengths.sum()) != result.tokens:
        raise BadInputError(f"{src}: read-back mismatch ({len(check)} docs / {result.documents} written)")
    del check
    if _should_stop():  # the driver is gone or stopping: it could not record this shard
        raise _Stopped(str(src))
    os.replace(tmp_bin, prefix_path.with_name(prefix_path.name + ".bin"))
    os.replace(tmp_idx, prefix_path.with_name(prefix_path.name + ".idx"))


# ---- driver side ---------------------------------------------------------------------------------


def load_manifest(output_dir: Path) -> dict[str, Any]:
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return {"shards": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def _write_manifest(output_dir: Path, manifest: dict[str, Any]) -> None:
    try:
        write_text_atomic(Path(output_dir) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    except OSError as err:
        raise OutputError(f"{Path(output_dir) / MANIFEST}: cannot write ({err.strerror})") from None


def is_up_to_date(entry: dict[str, Any] | None, src: Path, prefix: Path) -> bool:
    """Same input file (path, size, mtime) and both outputs present. A change of tokenizer or of an option
    that changes the tokens has already emptied the manifest's shards (convert_directory)."""
    if not entry:
        return False
    stat = src.stat()
    return (
        entry.get("input") == str(src)
        and entry["input_size"] == stat.st_size
        and entry["input_mtime_ns"] == stat.st_mtime_ns
        and Path(f"{prefix}.bin").is_file()
        and Path(f"{prefix}.idx").is_file()
    )


def remove_orphans(output_dir: Path, manifest: dict[str, Any], planned: set[str], output_prefix: str) -> list[str]:
    """Shards the manifest records but this run would not make (their input was deleted or renamed, or the
    directory now holds fewer files): their .bin / .idx and their manifest entries go, so a blend of the
    directory never reads a document twice or from a file that is no longer an input. Only files the manifest
    names are removed."""
    ours = re.compile(re.escape(output_prefix) + r"_part-\d{5}_text_document")  # never another prefix's shards
    orphans = sorted(n for n in set(manifest["shards"]) - planned if ours.fullmatch(n))
    for name in orphans:
        for ext in (".bin", ".idx"):
            (Path(output_dir) / f"{name}{ext}").unlink(missing_ok=True)
        del manifest["shards"][name]
    if orphans:
        _write_manifest(output_dir, manifest)
    return orphans


_PROGRESS = None
_STOP: Any = None  # the driver's stop event (set on SIGINT / SIGTERM)
_DRIVER_GONE = False


class _Stopped(Exception):
    pass


def _should_stop() -> bool:
    return _DRIVER_GONE or (_STOP is not None and _STOP.is_set())


def _watch_driver(driver_pid: int) -> None:
    """A worker whose driver died (SIGKILL) stops at its next batch instead of converting the queue for nobody."""
    global _DRIVER_GONE
    while True:
        time.sleep(1.0)
        try:
            os.kill(driver_pid, 0)
        except PermissionError:
            continue
        except ProcessLookupError:
            _DRIVER_GONE = True
            time.sleep(30)  # a shard stuck in one batch for that long is ended outright
            os._exit(1)


def _init_worker(threads: int, progress: Any, stop: Any = None, driver_pid: int | None = None) -> None:
    # The Rust tokenizer's thread pool reads this once, at first use in the process.
    global _PROGRESS, _STOP
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _PROGRESS, _STOP = progress, stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the driver coordinates the stop
    if driver_pid is not None:
        threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True).start()


def _convert_in_worker(path: str, prefix: str, opts_dict: dict[str, Any]) -> dict[str, Any]:
    return convert_parquet_shard(path, prefix, opts_dict, _PROGRESS)


@contextmanager
def interrupts() -> Iterator[list[int]]:
    """SIGINT and SIGTERM, while converting, are recorded (the list gets the signal) instead of killing the
    driver, so it can stop the workers and keep what finished. Outside the main thread: nothing is installed."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    def handler(signum: int, _frame: Any) -> None:
        if caught:  # a second signal: stop waiting for the workers, die as the signal says
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        caught.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def convert_directory(opts: ConvertOptions, show_progress: bool = True) -> dict[str, Any]:
    """Convert every parquet file under opts.input_dir; returns the manifest."""
    import pyarrow.parquet as pq

    if opts.on_bad_row not in BAD_ROW_POLICIES:
        raise BadInputError(f"--on-bad-row: expected one of {BAD_ROW_POLICIES}, got {opts.on_bad_row!r}")
    files = list_parquet_files(opts.input_dir)
    opts.output_dir = Path(opts.output_dir)
    try:
        opts.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{opts.output_dir}: cannot create the output directory ({err.strerror})") from None
    tokenizer_sha = tokenizer_fingerprint(opts.tokenizer_dir)
    manifest = load_manifest(opts.output_dir)
    planned = {output_prefix_for(opts, index).name: src for index, src in enumerate(files)}
    removed = remove_orphans(opts.output_dir, manifest, set(planned), opts.output_prefix)
    made_with = dict(tokenizer_sha256=tokenizer_sha, text_key=opts.text_key, append_eod=opts.append_eod)
    if any(manifest.get(k) not in (None, v) for k, v in made_with.items()):
        manifest["shards"] = {}  # another tokenizer, column or EOD setting makes every output stale
    manifest.update(made_with, tokenizer_dir=str(opts.tokenizer_dir), input_dir=str(opts.input_dir))
    todo = []
    for name, src in planned.items():
        prefix = opts.output_dir / name
        if not is_up_to_date(manifest["shards"].get(name), src, prefix):
            todo.append((src, prefix))
    shards, workers = opts.resolved_parallelism(len(todo) or 1)
    skipped_up_to_date = len(files) - len(todo)
    if not todo:
        _write_manifest(opts.output_dir, manifest)
        return manifest | {"converted": 0, "up_to_date": skipped_up_to_date, "removed": removed}

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
    ctx.set_forkserver_preload(
        ["megatron.core.datasets.indexed_dataset", "pyarrow.parquet", "kaiyuan_recipes.data.encoders"])
    progress_queue, stop = ctx.Queue(), ctx.Event()
    opts_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                   TimeRemainingColumn(), disable=not show_progress)
    started = time.perf_counter()
    failures: list[str] = []
    def record(fut: Any) -> None:
        try:
            result = fut.result()
        except OutputError as err:  # a full or read-only disk: every further shard would fail the same way
            failures.append(str(err))
            caught.append(0)
            return
        except BadInputError as err:
            failures.append(str(err))
            return
        except BrokenProcessPool as err:  # a worker killed from outside (OOM killer, a group-wide signal)
            failures.append(f"a conversion worker died ({err}); rerun to convert the remaining shards")
            caught.append(0)
            return
        except (_Stopped, CancelledError):
            return
        manifest["shards"][futures[fut].name] = result
        _write_manifest(opts.output_dir, manifest)  # a finished shard is never redone

    with bar, interrupts() as caught, ProcessPoolExecutor(
            max_workers=shards, mp_context=ctx, initializer=_init_worker,
            initargs=(workers, progress_queue, stop, os.getpid())) as pool:
        task = bar.add_task("rows", total=total_rows)
        futures = {pool.submit(_convert_in_worker, str(src), str(prefix), opts_dict): prefix for src, prefix in todo}
        pending = set(futures)
        while pending and not caught:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            while not progress_queue.empty():
                bar.advance(task, progress_queue.get_nowait())
            for fut in done:
                record(fut)
        if caught:  # workers stop at their next batch (cleaning their temporary files); queued shards never start
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            for fut in pending:
                record(fut)  # a shard that finished while stopping is kept
    if caught:
        for _, prefix in todo:
            for ext in (".bin", ".idx"):
                Path(f"{prefix.with_name(f'.{prefix.name}.tmp')}{ext}").unlink(missing_ok=True)
        finished = sum(1 for _, prefix in todo if prefix.name in manifest["shards"])
        if caught[0] == 0:  # stopped by a failure, not a signal
            raise OutputError("; ".join(failures) + f" ({finished} of {len(todo)} shards finished and kept)")
        raise ConversionInterrupted(caught[0], finished, len(todo) - finished)
    elapsed = time.perf_counter() - started
    if failures:
        raise BadInputError("; ".join(failures)
                            + f" ({len(failures)} of {len(todo)} files failed; the others are kept)")
    return manifest | {"converted": len(todo), "up_to_date": skipped_up_to_date, "removed": removed, "seconds": elapsed,
                       "num_shards": shards, "workers_per_shard": workers}
