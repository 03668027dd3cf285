"""parquet → Megatron indexed dataset (.bin/.idx), one output prefix per input file: the driver.

Each input file is converted by one worker process (data/convert_worker.py); N files run at once. A manifest per
output directory records what each output was made from, so finished shards are skipped on a re-run and stale ones
(input or tokenizer changed) are redone."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Iterable, Iterator

from kaiyuan_recipes.atomic import write_text_atomic
from kaiyuan_recipes.data.clean.manifest import manifest_summary as clean_summary
from kaiyuan_recipes.data.clean.manifest import read_manifest as read_clean_manifest
from kaiyuan_recipes.data.convert_worker import (
    BAD_ROW_POLICIES,
    RANK_SUFFIX,
    BadInputError,
    ConvertOptions,
    OutputError,
    _convert_in_worker,
    _init_worker,
    _Stopped,
    convert_parquet_shard,
    output_prefix_for,
    rank_path,
)
from kaiyuan_recipes.data.parquet_inputs import parquet_files
from kaiyuan_recipes.data.tokenizer import tokenizer_fingerprint, tokenizer_identity

MANIFEST = "manifest.json"


class ConversionInterrupted(Exception):
    """SIGINT / SIGTERM stopped the conversion: finished shards are in the manifest, nothing else was kept."""

    def __init__(self, signum: int, finished: int, stopped: int):
        self.signum = signum
        super().__init__(f"stopped by signal {signum}: {finished} shard(s) finished and recorded, {stopped} not "
                         "written (a rerun converts them)")


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


def is_up_to_date(entry: dict[str, Any] | None, src: Path, prefix: Path, rank_key: str = "rank") -> bool:
    """Same input file (path, size, mtime) and its outputs present (the ranks too, where it had them). A change of
    tokenizer or of an option that changes the tokens has already emptied the manifest's shards (convert_directory).
    An entry from before ranks were kept is redone only if its input has a rank column."""
    if not entry:
        return False
    stat = src.stat()
    if "ranked" in entry:
        ranks_ok = entry["ranked"] == rank_path(prefix).is_file()
    else:
        import pyarrow.parquet as pq

        ranks_ok = rank_key not in pq.read_schema(src).names
    return (
        # resolved both sides: `in/` and `/abs/in` are one input (a manifest from before absolute paths holds the
        # relative spelling, taken from the working directory)
        Path(entry.get("input", "")).resolve() == src.resolve()
        and entry["input_size"] == stat.st_size
        and entry["input_mtime_ns"] == stat.st_mtime_ns
        and Path(f"{prefix}.bin").is_file()
        and Path(f"{prefix}.idx").is_file()
        and ranks_ok
    )


def remove_orphans(output_dir: Path, manifest: dict[str, Any], planned: set[str], output_prefix: str) -> list[str]:
    """Shards the manifest records but this run would not make (their input was deleted or renamed, or the
    directory now holds fewer files): their .bin / .idx and their manifest entries go, so a blend of the
    directory never reads a document twice or from a file that is no longer an input. Only files the manifest
    names are removed."""
    ours = re.compile(re.escape(output_prefix) + r"_part-\d{5}_text_document")  # never another prefix's shards
    orphans = sorted(n for n in set(manifest["shards"]) - planned if ours.fullmatch(n))
    for name in orphans:
        for ext in (".bin", ".idx", RANK_SUFFIX):
            (Path(output_dir) / f"{name}{ext}").unlink(missing_ok=True)
        del manifest["shards"][name]
    if orphans:
        _write_manifest(output_dir, manifest)
    return orphans


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


def _as_dict(opts: ConvertOptions) -> dict[str, Any]:
    """The options as a worker (or convert_parquet_shard here) takes them: plain, picklable values."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}


def _convert_here(opts: ConvertOptions, todo: list[tuple[Path, Path]], manifest: dict[str, Any]) -> dict[str, Any]:
    """Each shard converted by this process, recorded as it finishes. A stop (an exception from this process's
    own signal handling) ends the shard in progress without its temporary files (convert_parquet_shard); the
    finished ones are kept, as with workers."""
    opts_dict = _as_dict(opts)
    started = time.perf_counter()
    # A process that has used the Rust tokenizer's thread pool and then forks (a rank's data-loader workers) prints
    # tokenizers' fork warning: a corpus this small is encoded without the pool, unless the user chose.
    chosen = "TOKENIZERS_PARALLELISM" in os.environ
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        for src, prefix in todo:
            manifest["shards"][prefix.name] = convert_parquet_shard(str(src), str(prefix), opts_dict)
            _write_manifest(opts.output_dir, manifest)
    finally:
        if not chosen:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
    return manifest | {"converted": len(todo), "seconds": time.perf_counter() - started, "num_shards": 1,
                       "workers_per_shard": 1}


def _current_manifest(opts: ConvertOptions, planned: dict[str, Path]) -> tuple[dict[str, Any], list[str]]:
    """The output directory's manifest made current for this conversion (the outputs no longer planned removed;
    every shard stale under another tokenizer, column or EOD setting; the tokenizer and cleaning recorded), and the
    names of the outputs removed."""
    tokenizer_sha = tokenizer_fingerprint(opts.tokenizer_dir)
    manifest = load_manifest(opts.output_dir)
    removed = remove_orphans(opts.output_dir, manifest, set(planned), opts.output_prefix)
    made_with = dict(tokenizer_sha256=tokenizer_sha, text_key=opts.text_key, append_eod=opts.append_eod)
    if any(manifest.get(k) not in (None, v) for k, v in made_with.items()):
        manifest["shards"] = {}  # another tokenizer, column or EOD setting makes every output stale
    vocab, eod = tokenizer_identity(opts.tokenizer_dir)  # what a run compares with its tokenizer (data/preflight.py)
    manifest.update(made_with, tokenizer_dir=str(Path(opts.tokenizer_dir).resolve()), tokenizer_vocab_size=vocab,
                    tokenizer_eod_id=eod, input_dir=str(opts.input_dir))
    cleaned = read_clean_manifest(opts.input_dir)  # `kaiyuan data clean` output: what was removed, and how
    if cleaned:
        manifest["cleaning"] = clean_summary(cleaned, opts.input_dir)
    else:
        manifest.pop("cleaning", None)
    return manifest, removed


def _total_rows(sources: Iterable[Path]) -> int:
    """The rows the progress bar counts up to, from the files' footers."""
    import pyarrow.parquet as pq

    total = 0
    for src in sources:
        try:
            total += pq.ParquetFile(src).metadata.num_rows
        except Exception:  # reported properly by the worker, with the file name
            pass
    return total


def _stopped(cause: int, failures: list[str], todo: list[tuple[Path, Path]], manifest: dict[str, Any]) -> Exception:
    """The error a stopped conversion raises (cause 0: a failure every further shard would meet, else the signal),
    once the temporary files of the shards it had started are removed; the finished shards are kept."""
    for _, prefix in todo:
        for ext in (".bin", ".idx", RANK_SUFFIX):
            Path(f"{prefix.with_name(f'.{prefix.name}.tmp')}{ext}").unlink(missing_ok=True)
    finished = sum(1 for _, prefix in todo if prefix.name in manifest["shards"])
    if cause == 0:  # stopped by a failure, not a signal
        return OutputError("; ".join(failures) + f" ({finished} of {len(todo)} shards finished and kept)")
    return ConversionInterrupted(cause, finished, len(todo) - finished)


def _worker_context() -> Any:
    """The multiprocessing context the conversion workers start from."""
    # forkserver: workers fork from a clean single-threaded server that has imported the heavy
    # modules (torch, megatron-core) once. Plain fork is unsafe from a process that already runs
    # threads (a training process, a test runner); spawn would repeat the imports in every worker.
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(
        ["kaiyuan_recipes.data.quiet_worker_imports", "megatron.core.datasets.indexed_dataset", "pyarrow.parquet",
         "kaiyuan_recipes.data.convert_worker"])
    return ctx


def convert_directory(opts: ConvertOptions, show_progress: bool = True) -> dict[str, Any]:
    """Convert every parquet file under opts.input_dir; returns the manifest."""
    if opts.on_bad_row not in BAD_ROW_POLICIES:
        raise BadInputError(f"--on-bad-row: expected one of {BAD_ROW_POLICIES}, got {opts.on_bad_row!r}")
    opts.input_dir = Path(os.path.abspath(opts.input_dir))  # the manifest records one spelling of each input
    files = parquet_files(opts.input_dir, BadInputError)
    opts.output_dir = Path(opts.output_dir)
    try:
        opts.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{opts.output_dir}: cannot create the output directory ({err.strerror})") from None
    planned = {output_prefix_for(opts, index).name: src for index, src in enumerate(files)}
    manifest, removed = _current_manifest(opts, planned)
    todo = []
    for name, src in planned.items():
        prefix = opts.output_dir / name
        if not is_up_to_date(manifest["shards"].get(name), src, prefix, opts.rank_key):
            todo.append((src, prefix))
    shards, workers = opts.resolved_parallelism(len(todo) or 1)
    skipped_up_to_date = len(files) - len(todo)
    if not todo:
        _write_manifest(opts.output_dir, manifest)
        return manifest | {"converted": 0, "up_to_date": skipped_up_to_date, "removed": removed}

    if opts.in_process:
        return _convert_here(opts, todo, manifest) | {"up_to_date": skipped_up_to_date, "removed": removed}
    total_rows = _total_rows(src for src, _ in todo)
    ctx = _worker_context()
    progress_queue, stop = ctx.Queue(), ctx.Event()
    opts_dict = _as_dict(opts)
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
        raise _stopped(caught[0], failures, todo, manifest)
    elapsed = time.perf_counter() - started
    if failures:
        raise BadInputError("; ".join(failures)
                            + f" ({len(failures)} of {len(todo)} files failed; the others are kept)")
    return manifest | {"converted": len(todo), "up_to_date": skipped_up_to_date, "removed": removed, "seconds": elapsed,
                       "num_shards": shards, "workers_per_shard": workers}
