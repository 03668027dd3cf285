"""One conversion worker: one parquet file → one Megatron .bin/.idx prefix, streamed in record batches (memory stays
flat), tokenized on M threads (kaiyuan_recipes.data.encoders), EOD appended, written through megatron-core's
IndexedDatasetBuilder under a temporary name that is renamed when complete; and the worker's side of a stop (the
driver's stop event, or the driver gone). The driver that runs N of these at once is data/convert.py."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.encoders import make_batch_encoder
from kaiyuan_recipes.data.tokenizer import tokenizer_vocab_size

BAD_ROW_POLICIES = ("error", "skip")
RANK_SUFFIX = ".rank.npy"  # beside <prefix>.bin / .idx: one float64 per document, in document order


def rank_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}{RANK_SUFFIX}")


class BadInputError(ValueError):
    pass


class OutputError(RuntimeError):
    """The output cannot be written (a full or read-only disk, no permission); temporary files are removed."""


OUTPUT_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG}


@dataclass
class ConvertOptions:
    input_dir: Path
    output_dir: Path
    tokenizer_dir: Path
    output_prefix: str
    text_key: str = "text"
    rank_key: str = "rank"       # kept per document beside the shard when the file has it (ordered phases)
    num_shards: int = 0          # 0: sized to the cores
    workers_per_shard: int = 0   # 0: sized to the cores
    batch_size: int = 1000
    on_bad_row: str = "error"
    append_eod: bool = True
    # The files converted one after the other in the calling process: for a corpus of a few MB (the bundled
    # sample) starting worker processes, each importing torch and megatron-core, costs more than converting it.
    in_process: bool = False

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
    ranked: bool = False  # <prefix>.rank.npy written


def output_prefix_for(opts: ConvertOptions, index: int) -> Path:
    # The original scripts' names, so existing blends keep working.
    return opts.output_dir / f"{opts.output_prefix}_part-{index:05d}_text_document"


# ---- worker side ---------------------------------------------------------------------------------


def _bad(result: ShardResult, path: Path, row: int, why: str, policy: str) -> None:
    message = f"{path}: row {row} (0-based): {why}"
    if policy == "error":
        raise BadInputError(message)
    result.skipped_rows += 1
    if len(result.skipped_examples) < 5:
        result.skipped_examples.append(message)


def _texts_of(batch: Any, column: str, path: Path, first_row: int, result: ShardResult, policy: str,
              kept: list[int] | None = None) -> list[str]:
    """The batch's usable texts; `kept` (when given) receives the batch rows they came from."""
    import pyarrow as pa

    array = batch.column(column)
    kept = [] if kept is None else kept
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
            kept.append(i)
        return texts
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise BadInputError(f"{path}: column '{column}' has type {array.type}; expected string")
    values = array.to_pylist()
    if array.null_count == 0 and all(values):
        kept.extend(range(len(values)))
        return values
    for i, text in enumerate(values):
        if text is None:
            _bad(result, path, first_row + i, f"'{column}' is null", policy)
        elif not text:
            _bad(result, path, first_row + i, f"'{column}' is empty", policy)
        else:
            texts.append(text)
            kept.append(i)
    return texts


def _ranks_of(batch: Any, column: str, path: Path, first_row: int, rows: list[int]) -> list[float]:
    """The curriculum positions of the kept rows (released phase 3-5 files carry a numeric 'rank')."""
    import pyarrow as pa

    array = batch.column(column)
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        raise BadInputError(f"{path}: column '{column}' has type {array.type}; expected a number (the document's "
                            "curriculum rank)")
    values = array.to_pylist()
    for i in rows:
        if values[i] is None or values[i] != values[i]:
            raise BadInputError(f"{path}: row {first_row + i} (0-based): '{column}' is null or NaN")
    return [float(values[i]) for i in rows]


def convert_parquet_shard(path: str, prefix: str, opts_dict: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """Convert one parquet file into `<prefix>.bin/.idx`. Runs in a worker process."""
    import numpy as np
    import pyarrow as pa
    import torch
    from megatron.core.datasets.indexed_dataset import DType

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

    parquet = _open_input(src, opts.text_key)
    result.ranked = opts.rank_key in parquet.schema_arrow.names
    columns = [opts.text_key] + ([opts.rank_key] if result.ranked else [])
    ranks: list[float] = []

    # Hidden temporary prefix in the same directory: readable by IndexedDataset, renamed when whole.
    tmp_prefix = prefix_path.with_name(f".{prefix_path.name}.tmp")
    tmp_bin = Path(f"{tmp_prefix}.bin")
    builder = _new_builder(tmp_bin, dtype, src)
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
                for batch in parquet.iter_batches(batch_size=opts.batch_size, columns=columns,
                                                  row_groups=[group]):
                    if _should_stop():
                        raise _Stopped(str(src))
                    kept: list[int] = []
                    texts = _texts_of(batch, opts.text_key, src, row, result, opts.on_bad_row, kept)
                    if result.ranked:
                        ranks.extend(_ranks_of(batch, opts.rank_key, src, row, kept))
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
    if result.documents == 0:  # every row skipped (--on-bad-row skip): an empty shard is no source to train on
        _discard(builder, tmp_bin)
        raise BadInputError(f"{src}: all {result.skipped_rows} rows skipped as bad, nothing to convert "
                            f"({'; '.join(result.skipped_examples[:2])}); fix or remove the file")
    _publish_shard(builder, tmp_prefix, prefix_path, result, src, ranks)
    result.seconds = time.perf_counter() - start
    return asdict(result)


def _open_input(src: Path, text_key: str) -> Any:
    """The parquet file to convert, refused naming it when unreadable, without the text column, or without rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(src)
    except (pa.ArrowInvalid, OSError) as err:
        raise BadInputError(f"{src}: not a readable parquet file ({err})") from err
    if text_key not in parquet.schema_arrow.names:
        raise BadInputError(f"{src}: no column '{text_key}' (columns: {', '.join(parquet.schema_arrow.names)})")
    if parquet.metadata.num_rows == 0:
        raise BadInputError(f"{src}: the file has no rows")
    return parquet


def _new_builder(tmp_bin: Path, dtype: Any, src: Path) -> Any:
    """megatron-core's IndexedDatasetBuilder writing `tmp_bin` (an unwritable folder: an OutputError)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    try:
        return IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
    except OSError as err:
        tmp_bin.unlink(missing_ok=True)
        raise OutputError(f"{tmp_bin.parent}: cannot write the shard of {src.name} ({err.strerror})") from None


def _publish_shard(builder: Any, tmp_prefix: Path, prefix: Path, result: ShardResult, src: Path,
                   ranks: list[float]) -> None:
    """_finish_shard, or on any failure its temporary files removed (a write failure as an OutputError)."""
    try:
        _finish_shard(builder, tmp_prefix, prefix, result, src, ranks)
    except BaseException as err:
        for path in (Path(f"{tmp_prefix}.bin"), Path(f"{tmp_prefix}.idx"), rank_path(tmp_prefix)):
            path.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputError(f"{prefix.parent}: cannot write the shard of {src.name} ({err.strerror})") from None
        raise


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


def _finish_shard(builder: Any, tmp_prefix: Path, prefix_path: Path, result: ShardResult, src: Path,
                  ranks: list[float]) -> None:
    """The index (and the documents' ranks), a read-back with megatron-core's own reader, then the final names."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tmp_bin, tmp_idx = Path(f"{tmp_prefix}.bin"), Path(f"{tmp_prefix}.idx")
    builder.finalize(str(tmp_idx))
    check = IndexedDataset(str(tmp_prefix))
    if len(check) != result.documents or int(check.sequence_lengths.sum()) != result.tokens:
        raise BadInputError(f"{src}: read-back mismatch ({len(check)} docs / {result.documents} written)")
    del check
    if result.ranked:
        if len(ranks) != result.documents:
            raise BadInputError(f"{src}: {len(ranks)} ranks for {result.documents} documents")
        with open(rank_path(tmp_prefix), "wb") as f:
            np.save(f, np.asarray(ranks, dtype=np.float64))
    if _should_stop():  # the driver is gone or stopping: it could not record this shard
        raise _Stopped(str(src))
    os.replace(tmp_bin, prefix_path.with_name(prefix_path.name + ".bin"))
    os.replace(tmp_idx, prefix_path.with_name(prefix_path.name + ".idx"))
    if result.ranked:  # last: a shard whose ranks are missing is not yet recorded, so a rerun redoes it
        os.replace(rank_path(tmp_prefix), rank_path(prefix_path))
    else:
        rank_path(prefix_path).unlink(missing_ok=True)  # from an earlier input that had ranks


# ---- the worker process ---------------------------------------------------------------------------


_PROGRESS = None
_STOP: Any = None  # the driver's stop event (set on SIGINT / SIGTERM)
_DRIVER_GONE = threading.Event()
_BUSY = threading.Event()  # a shard is being converted (its temporary files are open)
DRIVER_POLL_S = 0.2
# After the driver is gone: how long a shard may take to reach its next batch and clean its temporary files
# before the worker exits anyway.
ORPHAN_GRACE_S = 2.0


class _Stopped(Exception):
    pass


def _should_stop() -> bool:
    return _DRIVER_GONE.is_set() or (_STOP is not None and _STOP.is_set())


def _watch_driver(driver_pid: int) -> None:
    """A worker whose driver died (SIGKILL, or its forkserver gone: PR_SET_PDEATHSIG) stops at its next batch
    (removing its temporary files) and exits, instead of converting the queue for nobody."""
    while not _DRIVER_GONE.is_set():
        try:
            os.kill(driver_pid, 0)
        except ProcessLookupError:
            _DRIVER_GONE.set()
        except PermissionError:
            pass  # a pid reused by another user's process: the forkserver's death still reaches us (PDEATHSIG)
        _DRIVER_GONE.wait(DRIVER_POLL_S)
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while _BUSY.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(1)


def _die_with_parent() -> None:
    """Linux: SIGTERM when this worker's parent (the forkserver, which exits as soon as the driver does) dies,
    whichever way the driver went; the handler starts the orphan's stop. A parent already gone: exit now."""
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the driver watch alone
    if os.getppid() != parent:
        os._exit(1)


def _init_worker(threads: int, progress: Any, stop: Any = None, driver_pid: int | None = None) -> None:
    # The Rust tokenizer's thread pool reads this once, at first use in the process.
    global _PROGRESS, _STOP
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _PROGRESS, _STOP = progress, stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the driver coordinates the stop
    # SIGTERM (the parent's death, or one sent to the whole group): stop at the next batch, as on the driver's stop.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: _DRIVER_GONE.set())
    if driver_pid is not None:
        _die_with_parent()
        threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True).start()


def _convert_in_worker(path: str, prefix: str, opts_dict: dict[str, Any]) -> dict[str, Any]:
    _BUSY.set()
    try:
        return convert_parquet_shard(path, prefix, opts_dict, _PROGRESS)
    finally:
        _BUSY.clear()
