"""`kaiyuan data index`: a run's dataset indices built ahead of its GPU launch, on any CPU node, into the cache the
run reads (`dataset.path_to_cache`, by default `<run>/dataset_cache/`), so the launch finds every index cached.

The config is the run's own (training/config.build_config on the same recipe, phase and overrides, then
Megatron-Bridge's runtime_config_update), and the datasets are built by Bridge's own functions as `pretrain`'s set-up
builds them (training/setup.py: the tokenizer on the dataset config, the dataset provider Bridge picks for the
config, data/loaders.build_train_valid_test_datasets with the sizes it asks for), so every cache file name -- a
hash of the dataset, its sample count and the config -- is the one the run will look for.

The build runs in a child process: a SIGTERM or Ctrl-C ends it at once, even inside megatron-core's C++ index
helpers, and the staging folder it built into is removed; the cache only receives whole files
(data/index_cache.py)."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kaiyuan_recipes.data.index_cache import (
    STAGING_PREFIX,
    open_staging,
    publish_staging,
    remove_stale_staging,
    sweep_incomplete,
)

# megatron-core warns whenever a blend has one source (a curriculum phase of one source does): nothing to act on.
SINGLE_SOURCE_BLEND = "Building a BlendedDataset for a single MegatronDataset"
HEARTBEAT_S = 30  # a line this often while one source's index builds (megatron-core reports no progress inside)


class IndexInterrupted(RuntimeError):
    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: nothing was added to the cache")
        self.signum = signum


@dataclass
class IndexReport:
    cache: Path
    built: list[Path] = field(default_factory=list)  # files added to the cache
    cached: int = 0  # entries (description files) that were there already
    swept: list[Path] = field(default_factory=list)  # truncated files removed first
    seconds: float = 0.0


def build_as_pretrain(cfg: Any) -> tuple[Any, Any, Any]:
    """The train / validation / test datasets of `cfg` (resolved by runtime_config_update), built as Bridge's
    pretrain set-up builds them."""
    import numpy
    from megatron.bridge.data.loaders import build_train_valid_test_datasets
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(cfg.tokenizer)
    if hasattr(cfg.dataset, "tokenizer"):
        cfg.dataset.tokenizer = tokenizer
    if getattr(cfg.dataset, "token_dtype_code", 0) is None and getattr(tokenizer, "vocab_size", None) is not None:
        cfg.dataset.token_dtype_code = 4 if tokenizer.vocab_size > numpy.iinfo(numpy.uint16).max + 1 else 8
    provider = get_dataset_provider(cfg.dataset)
    if "tokenizer" in inspect.signature(provider).parameters:
        provider = partial(provider, tokenizer=tokenizer)
    return build_train_valid_test_datasets(cfg, provider)


def _prefixes(dataset: Any) -> int:
    if getattr(dataset, "blend", None):
        return len(dataset.blend[0])
    per_split = getattr(dataset, "blend_per_split", None) or []
    return max((len(b[0]) for b in per_split if b), default=0)


class _Progress(logging.Handler):
    """megatron-core's index-build log records as one line per source: which source and split, how many samples,
    how long. Its records do not name the source, so the dataset is found on the logging call's stack (the record
    is emitted from inside the dataset's own method, in the building thread)."""

    def __init__(self, sources: int):
        super().__init__(logging.INFO)
        self.sources = sources
        self.started: dict[int, tuple[float, str]] = {}
        self.count: dict[str, int] = {}

    @staticmethod
    def _dataset() -> Any:
        from megatron.core.datasets.blended_dataset import BlendedDataset
        from megatron.core.datasets.megatron_dataset import MegatronDataset

        frame = sys._getframe(1)
        for _ in range(40):
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, (MegatronDataset, BlendedDataset)):
                return candidate
            frame = frame.f_back
        return None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        thread = threading.get_ident()
        if message.startswith("Build and save the "):
            dataset = self._dataset()
            split = getattr(getattr(dataset, "index_split", None) or getattr(dataset, "split", None), "name", "?")
            if hasattr(dataset, "dataset_path"):
                self.count[split] = self.count.get(split, 0) + 1
                # num_samples is None for a blend without weights: each source is indexed for one epoch
                samples = ("one epoch" if dataset.num_samples is None else f"{dataset.num_samples:,} samples")
                what = (f"[{split} {self.count[split]}/{self.sources}] {dataset.dataset_path}: "
                        f"{samples} over {len(dataset.indices):,} documents")
                self.started[thread] = (time.monotonic(), what)
            elif dataset is not None:  # megatron-core logs no end for a blend
                what = f"[{split}] blending {len(dataset.datasets)} sources: {dataset.size:,} samples"
            else:
                what = message
            print(f"  building {what}", flush=True)
        elif message.startswith("> total number of samples") and thread in self.started:
            t0, _ = self.started.pop(thread)
            print(f"    done in {time.monotonic() - t0:.1f} s ({message[2:]})", flush=True)
        elif record.levelno >= logging.WARNING and not message.startswith(SINGLE_SOURCE_BLEND):
            print(f"  megatron: {message}", flush=True)


def _build_in_child(resolved: Any, sources: int) -> None:
    """In the forked child: build, report, exit (never returns)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    code = 0
    try:
        datasets_logger = logging.getLogger("megatron.core.datasets")
        datasets_logger.setLevel(logging.INFO)
        datasets_logger.propagate = False
        datasets_logger.addHandler(_Progress(sources))
        train, valid, test = build_as_pretrain(resolved)
        lengths = ", ".join(f"{name} {len(d):,}" for name, d in (("train", train), ("validation", valid),
                                                                   ("test", test)) if d is not None)
        print(f"  datasets: {lengths} samples", flush=True)
    except Exception as err:  # noqa: BLE001 (reported to the parent by the exit code, the message here)
        print(f"kaiyuan: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, t0: float) -> int:
    """The child's exit status; a line every HEARTBEAT_S while it runs."""
    last = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() - last >= HEARTBEAT_S:
            last = time.monotonic()
            print(f"  ... still indexing ({last - t0:.0f} s)", flush=True)
        time.sleep(0.2)


def prebuild_indices(resolved: Any) -> IndexReport:
    """Build every index `resolved` (a config after runtime_config_update) will read into its path_to_cache."""
    t0 = time.monotonic()
    cache = Path(resolved.dataset.path_to_cache)
    cache.mkdir(parents=True, exist_ok=True)
    report = IndexReport(cache=cache)
    remove_stale_staging(cache)
    report.swept = sweep_incomplete(cache)
    staging = open_staging(cache)
    resolved.dataset.path_to_cache = str(staging)

    def stop(signum: int, frame: Any) -> None:
        raise IndexInterrupted(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    pid = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _build_in_child(resolved, _prefixes(resolved.dataset))
        code = _wait(pid, t0)
        pid = None
        if code != 0:
            raise RuntimeError(f"building the dataset indices failed (exit {code}); nothing was added to {cache}")
        for signum in previous:  # the renames below are quick and each leaves the cache whole
            signal.signal(signum, signal.SIG_IGN)
        report.cached = sum(1 for p in staging.glob("*description.txt") if p.is_symlink())
        report.built = publish_staging(staging, cache)
    finally:
        if pid is not None:  # interrupted: the child goes at once, with what it built
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if staging.exists():
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    report.seconds = time.monotonic() - t0
    return report


def describe(report: IndexReport) -> str:
    entries = sum(1 for p in report.built if p.name.endswith("description.txt"))
    size = sum(p.stat().st_size for p in report.built if p.is_file()) / 1e6
    swept = f"; removed {len(report.swept)} truncated file(s) first" if report.swept else ""
    if not report.built:
        return (f"every index this run reads is cached in {report.cache} ({report.cached} entries there; "
                f"{report.seconds:.1f} s){swept}")
    return (f"built {entries} index entries ({size:,.1f} MB) in {report.seconds:.1f} s into {report.cache}; "
            f"{report.cached} were cached already{swept}")


__all__ = ["STAGING_PREFIX", "IndexInterrupted", "IndexReport", "build_as_pretrain", "describe", "prebuild_indices"]
