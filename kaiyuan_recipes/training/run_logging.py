"""What a training worker's console shows, and the full log kept beside it.

The console (and logs/console.log, which records it) is for a person: once, what was decided (recipe, data,
layer spec, fast-path plan); per log interval one line of iteration, loss, lr, tokens/s, TFLOP/s, memory and ETA;
Megatron's own progress, warnings and errors. Upstream records a person does not need at every start go to the
full log only, `logs/upstream.rank<R>.log`, which holds every log record of every logger (and the upstream
configuration summary): nothing is lost. `KAIYUAN_VERBOSE=1` (`kaiyuan train/start --verbose`) puts everything
back on the console.

What is quiet on the console, and why:
- `megatron.bridge.utils.import_utils` "Import of X from Y failed with: Traceback ...": Bridge probes optional
  symbols at import time (FP8GlobalStateManager from Transformer Engine's extension module, absent without TE) and
  logs the caught AttributeError at INFO with its traceback, through its own handler and again through the root's.
  It is not an error; its ImportError twin is logged at DEBUG.
- `megatron.core.distributed.param_and_grad_buffer` INFO: "Using reduce-scatter for gradient reductions" once per
  bucket group and the name of every parameter of every bucket, at every start.
- Bridge's import-time probe of Gemma2's attention, and GPTModelProvider's warning that it turns the
  weight-gradient fusion off without TE / Apex (every construction; kaiyuan.wgrad_fusion then decides it).
- the same INFO record again (same logger, same text): once on the console is enough (dataset set-up progress
  excepted: its lines repeat once per source).
- Megatron-Bridge's "Configuration Summary (Non-Default Values vs Megatron Core)": a print of upstream defaults;
  the decided block above says what this run does.
- Python warnings raised while a module is imported: they say what the installed environment lacks (a dozen
  Megatron modules each warn "Transformer Engine and Apex are not installed. Falling back to …" on a host without
  them, the fast path's own case), never anything about this run. Bridge's "Function 'pretrain' is experimental"
  is about the API this package calls. Warnings raised later (Bridge capping a warm-up longer than the run, say)
  stay on the console.
- Bridge's "Pretrain failed ... SystemExit: 0" and its traceback when a run ends as asked after saving (a stop):
  not a failure."""

from __future__ import annotations

import collections
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kaiyuan_recipes.upstream_warnings import raised_while_importing

VERBOSE_ENV = "KAIYUAN_VERBOSE"
CONFIG_SUMMARY_HEADER = "Configuration Summary (Non-Default Values vs Megatron Core)"
_EARLY_RECORDS_KEPT = 10_000  # quiet records from before the run directory is known, held for the full log


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in {"1", "true", "yes"}


def full_log_path(logs_dir: Path, rank: int | None = None) -> Path:
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    return Path(logs_dir) / f"upstream.rank{rank}.log"


def after_a_clean_exit(record: logging.LogRecord) -> bool:
    """The record reports a SystemExit with status 0: the end of a run that stopped as asked."""
    error = record.exc_info[1] if record.exc_info else None
    return isinstance(error, SystemExit) and error.code in (0, None)


@dataclass(frozen=True)
class QuietRule:
    logger: str
    prefix: str  # the message starts with it ("" = every record of the logger up to `level`)
    level: int = logging.INFO  # the highest level quieted
    only_if: Any = None  # a further test of the record (None: none)


QUIET_RULES = (
    QuietRule("megatron.bridge.utils.import_utils", "Import of "),
    QuietRule("megatron.core.distributed.param_and_grad_buffer", ""),
    # a probe at import of a model not ours (INFO with FlexAttention, WARNING without)
    QuietRule("megatron.bridge.models.gemma.gemma2_provider", "Gemma2: ", logging.WARNING),
    # GPTModelProvider's default probes for TE / Apex at every construction and warns that it turns the fusion off;
    # the fusion is then decided for this run (kaiyuan.wgrad_fusion, shown in the decided block)
    QuietRule("megatron.bridge.utils.fusions", "gradient_accumulation_fusion requires ", logging.WARNING),
    # optional-package notices ("JAX version … available") logged while Megatron's training module imports, after
    # its console handler exists and before the console's policy can wrap it
    QuietRule("datasets", ""),
    # A run that stops as asked (SIGTERM, a stop or exit interval: a checkpoint saved, status 0) ends in Bridge's
    # train() with sys.exit(0), which _pretrain reports as "Pretrain failed ... SystemExit: 0" with a traceback at
    # ERROR. Any other failure it reports stays on the console.
    QuietRule("megatron.bridge.training.pretrain", "Pretrain failed on rank=", logging.ERROR, after_a_clean_exit),
)


class FullLog:
    """The full log's handler, and what quiet records arrive before it exists (bounded)."""

    def __init__(self) -> None:
        self.handler: logging.Handler | None = None
        self.early: collections.deque[logging.LogRecord] = collections.deque(maxlen=_EARLY_RECORDS_KEPT)
        self.early_text: list[str] = []

    def keep(self, record: logging.LogRecord) -> None:
        if self.handler is None:
            self.early.append(record)
        elif record.levelno >= self.handler.level:
            self.handler.handle(record)

    def open(self, path: Path) -> logging.Handler:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.handler = handler
        while self.early:
            handler.handle(self.early.popleft())
        if self.early_text:
            handler.stream.write("".join(self.early_text))
            self.early_text.clear()
        return handler

    def write(self, text: str) -> None:
        """Text that was printed, not logged (upstream's set-up prints, its configuration summary); held until the
        full log opens (bounded)."""
        if self.handler is None:
            if len(self.early_text) < _EARLY_RECORDS_KEPT:
                self.early_text.append(text)
            return
        self.handler.acquire()
        try:
            self.handler.stream.write(text)
            self.handler.flush()
        finally:
            self.handler.release()


class QuietOnConsole(logging.Filter):
    """On a quiet logger: its quiet records go to the full log only (a logger filter stops them before any handler,
    the logger's own included); the others go on as usual."""

    def __init__(self, rule: QuietRule, full_log: FullLog):
        super().__init__()
        self.rule, self.full_log = rule, full_log

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > self.rule.level or not record.getMessage().startswith(self.rule.prefix) or (
                self.rule.only_if is not None and not self.rule.only_if(record)):
            return True
        self.full_log.keep(record)
        return False


# Upstream INFO records a person watches a start for: building a dataset index (minutes on a large corpus), once per
# source and split: each is a step of progress, not a repeat. Every other upstream INFO record (set-up chatter,
# config dumps, optional-package notices such as `datasets`' "JAX version … available") is for the full log.
PROGRESS_SHOWN = (("megatron.core.datasets", "Build and save the "),)
OWN_LOGGERS = ("kaiyuan_recipes", "__main__")


class ConsoleRecords(logging.Filter):
    """On a console handler: warnings and errors, this package's own records and upstream's dataset-index
    progress; an INFO record repeated (same logger, same text) once. The full log, a handler of its own, has every
    record. Bounded: after `limit` distinct messages it stops remembering."""

    def __init__(self, full_log: FullLog, limit: int = 100_000):
        super().__init__()
        self.full_log = full_log
        self.seen: set[tuple[str, str]] = set()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        if any(record.name.startswith(name) and message.startswith(prefix) for name, prefix in PROGRESS_SHOWN):
            return True
        if not record.name.startswith(OWN_LOGGERS):
            if self.full_log.handler is None:  # once it is open, the full log's own handler has the record
                self.full_log.keep(record)
            return False
        key = (record.name, message)
        if key in self.seen:
            return False
        if len(self.seen) < self.limit:
            self.seen.add(key)
        return True


# Megatron's set-up prints on rank 0 (print_rank_0: "> initializing torch distributed ...", "> setting tensorboard
# ...", "time to initialize megatron (seconds): …", its datasets' "> building train, validation, and test datasets
# ..."): progress of upstream's own steps, for the full log. The run's phase (`kaiyuan status`) says the same.
UPSTREAM_PRINTS = re.compile(r"^ ?(> |>>> |time to initialize megatron|\[after .*\] datetime: |building GPT model|"
                             r"Number of parameters in |done with setup|Setting rerun_state_machine\.|"
                             r"Starting training loop at iteration |    (train|validation|test): +\d+$)")


class ConsoleStdout:
    """sys.stdout with the upstream configuration summary and set-up prints (UPSTREAM_PRINTS) sent to the full
    log instead."""

    def __init__(self, stream: TextIO, full_log: FullLog):
        self._stream, self._full_log = stream, full_log
        self._newline_pending = False  # print() writes its "\n" separately: dropped with the summary

    def write(self, text: str) -> int:
        if CONFIG_SUMMARY_HEADER in text or UPSTREAM_PRINTS.match(text):
            self._full_log.write(text + "\n")
            self._newline_pending = True
            return len(text)
        if self._newline_pending and text == "\n":
            self._newline_pending = False
            return len(text)
        self._newline_pending = False
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# Upstream's own API notice when this package calls a function Megatron-Bridge marks experimental
EXPERIMENTAL_API = re.compile(r"Function '[^']+' is experimental\. ")


# Said at every start, about upstream's internals: megatron-core's dataset has already worked around a pad id that is
# also the end-of-document id (Qwen2's, by design; its other branch, for dataset.allow_ambiguous_pad_tokens, stays on
# the console), and autograd's stream hint about Megatron's own gradient accumulation
UPSTREAM_NOTICES = ("the training flow will avoid masking out any pad tokens already present in the dataset",
                    "The AccumulateGrad node's stream does not match the stream of the node that produced")


def about_upstreams_api(message: str, category: type[Warning], filename: str) -> bool:
    """Warnings about how upstream's own code calls upstream (deprecations, an experimental function, c10d's
    barrier picking its device, UPSTREAM_NOTICES): nothing a user of this run can act on."""
    return (EXPERIMENTAL_API.match(message) is not None
            or issubclass(category, (DeprecationWarning, FutureWarning, SyntaxWarning))
            or " is deprecated" in message
            or any(notice in message for notice in UPSTREAM_NOTICES)
            or ("torch/distributed/" in filename.replace("\\", "/") and message.startswith("barrier(): ")))


class QuietWarnings:
    """warnings.showwarning for a worker: import-time warnings and those about upstream's own API to the full log
    only (as logging.captureWarnings words them); every other warning as before."""

    def __init__(self, full_log: FullLog, shown: Any):
        self.full_log, self.shown = full_log, shown

    def __call__(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
        if raised_while_importing() or about_upstreams_api(str(message), category, filename):
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
            self.full_log.keep(logging.LogRecord("py.warnings", logging.WARNING, filename, lineno, text, None, None))
            return
        self.shown(message, category, filename, lineno, file, "")  # one console line: not the source line too


_FULL_LOG = FullLog()
_CONSOLE_RECORDS = ConsoleRecords(_FULL_LOG)  # one filter (one memory of repeats) for every console handler
_quiet_installed = False


def quiet_upstream() -> None:
    """Before anything imports Megatron: the quiet loggers' filters (their records are kept for the full log).
    Idempotent; nothing under KAIYUAN_VERBOSE=1."""
    global _quiet_installed
    if _quiet_installed or verbose():
        return
    for rule in QUIET_RULES:
        logging.getLogger(rule.logger).addFilter(QuietOnConsole(rule, _FULL_LOG))
    warnings.showwarning = QuietWarnings(_FULL_LOG, warnings.showwarning)
    _quiet_installed = True


class FilteredConsole(logging.Handler):
    """A console handler behind a filter of ours. Megatron's root handler (megatron/training/log_handler.py's
    CustomHandler) overrides Handler.filter, so filters added to it are never consulted: it is wrapped instead."""

    def __init__(self, inner: logging.Handler, record_filter: logging.Filter):
        super().__init__(inner.level)
        self.inner = inner
        self.addFilter(record_filter)

    def emit(self, record: logging.LogRecord) -> None:
        self.inner.handle(record)


def _is_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))


def _filter_console_handlers(record_filter: logging.Filter) -> None:
    """Every console handler behind `record_filter`: the root's (Megatron's) and those libraries attach to their own
    loggers (`datasets` prints its notices through one of its own)."""
    loggers = [logging.getLogger()] + [logger for logger in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in list(logger.handlers):
            if _is_console(handler):
                logger.removeHandler(handler)
                logger.addHandler(FilteredConsole(handler, record_filter))


def start_full_log(logs_dir: Path) -> Path:
    """The full log for this rank in `logs_dir`: every record of every logger from here on (and the quiet ones
    from before); the console keeps repeated INFO records once and drops the configuration summary."""
    quiet_upstream()
    path = full_log_path(logs_dir)
    if _FULL_LOG.handler is None:
        logging.getLogger().addHandler(_FULL_LOG.open(path))
    quiet_console()
    return path


def quiet_console() -> None:
    """The console's policy (ConsoleRecords, ConsoleStdout) on the root's console handlers as they are now: called
    once Megatron has installed its own (megatron.training.training's basicConfig at import) and again when the
    full log opens. What it keeps off the console before the full log opens is held for it. Nothing under
    KAIYUAN_VERBOSE=1."""
    if verbose():
        return
    _filter_console_handlers(_CONSOLE_RECORDS)
    if not isinstance(sys.stdout, ConsoleStdout):
        sys.stdout = ConsoleStdout(sys.stdout, _FULL_LOG)


def print_decided(lines: list[str]) -> None:
    """The decided block, once, on rank 0."""
    if int(os.environ.get("RANK", "0")) == 0:
        print("\n".join(f"kaiyuan: {line}" for line in lines), flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds % 60:02d}s"


def progress_line(iteration: int, total: int, loss: float | None, lr: float | None, tokens_per_s: float,
                  gpus: int, tflops_per_gpu: float | None, peak_mem_gb: float | None,
                  seconds_per_step: float, note: str = "") -> str:
    """One console line per log interval (`note`: after the iteration, e.g. what made a first step long)."""
    parts = [f"iteration {iteration:,}/{total:,}{note}",
             "loss " + (f"{loss:.4f}" if loss is not None else "-"),
             "lr " + (f"{lr:.3e}" if lr is not None else "-"),
             f"{tokens_per_s:,.0f} tokens/s ({tokens_per_s / max(gpus, 1):,.0f}/GPU)",
             (f"{tflops_per_gpu:.1f} TFLOP/s/GPU" if tflops_per_gpu is not None else "TFLOP/s -"),
             (f"peak mem {peak_mem_gb:.1f} GB" if peak_mem_gb is not None else "peak mem -"),
             f"ETA {_duration(max(total - iteration, 0) * seconds_per_step)}"]
    return "kaiyuan: " + " | ".join(parts)


def start_console(cfg: Any, run: Any) -> Path:
    """A worker's console once its run is known: the full log in the run's logs/, then the decided block."""
    from kaiyuan_recipes.training.summary import decided_lines

    path = start_full_log(run.layout.logs)
    print_decided(decided_lines(cfg, run))
    return path
