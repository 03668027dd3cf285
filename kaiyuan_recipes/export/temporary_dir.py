"""A temporary directory that does not outlive the block using it: removed when the block ends, on an exception
(Ctrl-C's KeyboardInterrupt included), and on a SIGTERM, whose default action ends the process at once without
running any `finally`. An on-the-fly export of a 2B model is ~4 GB: left behind at every start, it fills the disk."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    """A fresh directory under TMPDIR. A SIGTERM while the block runs removes it, then takes the course it had
    before (by default the process ends by the signal, as a supervisor expects)."""
    path: Path | None = None
    previous = signal.getsignal(signal.SIGTERM)
    # Handlers can only be set from the main thread; a SIGTERM somebody chose to ignore stays ignored.
    watch = threading.current_thread() is threading.main_thread() and previous is not signal.SIG_IGN
    restore = signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python

    def remove_then_resend(signum: int, frame: object) -> None:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        signal.signal(signum, restore)
        signal.raise_signal(signum)

    if watch:
        signal.signal(signal.SIGTERM, remove_then_resend)
    try:
        # SIGTERM held back while the directory is made: once it exists, the handler knows its name
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            path = Path(tempfile.mkdtemp(prefix=prefix))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        yield path
    finally:
        if watch:
            signal.signal(signal.SIGTERM, restore)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
