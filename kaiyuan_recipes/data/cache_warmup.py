"""The cached inputs of a run on the bundled sample corpus, prepared in a process of their own while the rank
imports Megatron: on a host that has never run one, materialising the bundled tokenizer and tokenizing the corpus
are a large part of the set-up before the model is built, and they need neither Megatron's training stack nor the
resolved config. The rank then finds both in the cache (cache_lock makes it wait for a warm-up still writing);
a warm-up that fails costs nothing, since the rank prepares (and reports) the same inputs itself.

    python -m kaiyuan_recipes.data.cache_warmup [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from kaiyuan_recipes.config.launch_request import check_launch_request


def _end_with_parent(parent: int) -> None:
    """Linux: SIGTERM when the rank that started it ends (a stop during set-up ends the warm-up too)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request took effect
        raise SystemExit(1)


def _prepared(tokenizer: str | None) -> bool:
    """Both inputs already in the cache (the usual start): a look at the files, no heavy import."""
    from kaiyuan_recipes.data.sample_corpus import sample_corpus_dir
    from kaiyuan_recipes.data.tokenizer import bundled_tokenizer_cache_dir

    try:
        corpus = sample_corpus_dir(Path(tokenizer) if tokenizer else bundled_tokenizer_cache_dir())
    except OSError:  # the tokenizer is not materialised yet
        return False
    return (corpus / "manifest.json").is_file()


def start_cache_warmup(recipe: str, overrides: list[str]) -> subprocess.Popen | None:
    """The warm-up process for a run on the sample corpus (None for other data, or a request the rank's own
    resolution will refuse and word)."""
    try:
        knobs = check_launch_request(recipe, overrides).knobs
    except Exception:  # noqa: BLE001  (the rank's resolution reports it, with its context)
        return None
    if knobs.data != "sample" or _prepared(knobs.tokenizer):
        return None
    command = [sys.executable, "-m", "kaiyuan_recipes.data.cache_warmup", "--parent", str(os.getpid())]
    if knobs.tokenizer:
        command += ["--tokenizer", str(knobs.tokenizer)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_cache_warmup(process: subprocess.Popen | None, timeout_s: float = 30.0) -> None:
    """End and reap the warm-up once the rank has resolved its plan (the rank has its inputs then: what the warm-up
    still does, nobody uses) or had it refused."""
    if process is None or process.poll() is not None:
        return
    process.terminate()  # it ends as its SIGTERM handler says: temporary files removed
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaiyuan_recipes.data.cache_warmup")
    parser.add_argument("--tokenizer", type=Path, help="the run's tokenizer directory (default: the bundled one)")
    parser.add_argument("--parent", type=int, help="end when this process (the rank) ends")
    args = parser.parse_args(argv)
    # a SIGTERM (the rank's end, or finish_cache_warmup) unwinds: the half-written tokenizer or shard is removed
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(128 + signal.SIGTERM))
    if args.parent is not None:
        _end_with_parent(args.parent)
    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    prepare_sample_corpus(args.tokenizer or default_tokenizer_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
