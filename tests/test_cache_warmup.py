"""A rank on the sample corpus starts preparing its cached inputs (the bundled tokenizer, the tokenized corpus) in a
process of its own before importing Megatron; the rank's own resolution then finds them. Real processes, a fresh
cache per test."""

import os
import subprocess
import sys
import time

import pytest

from kaiyuan_recipes.data.cache_warmup import finish_cache_warmup, start_cache_warmup


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KAIYUAN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def prepared(cache):
    return sorted(p.parent.parent.name for p in cache.glob("sample_corpus/*/*.json"))


def test_only_a_run_on_the_sample_corpus_warms_the_cache(fresh_cache):
    assert start_cache_warmup("gpt_smoke", ["kaiyuan.data=mock"]) is None
    assert start_cache_warmup("no_such_recipe", []) is None  # the rank's resolution words the error
    process = start_cache_warmup("gpt_smoke", [])
    assert process is not None
    assert process.wait(timeout=600) == 0  # left alone, it finishes its work
    finish_cache_warmup(process)  # and then there is nothing to end
    assert (fresh_cache / "tokenizers" / "qwen2_bpe" / "tokenizer.json").is_file()
    assert prepared(fresh_cache) == ["sample_corpus"]
    assert start_cache_warmup("gpt_smoke", []) is None  # both in the cache: no process at all

    from kaiyuan_recipes.data.sample_corpus import prepare_sample_corpus

    before = {p: p.stat().st_mtime_ns for p in fresh_cache.glob("sample_corpus/*/*_document.*")}
    prefixes, weights = prepare_sample_corpus()  # what the rank does next: nothing left to convert
    assert len(prefixes) == 2 and all(w > 30_000 for w in weights)
    assert {p: p.stat().st_mtime_ns for p in fresh_cache.glob("sample_corpus/*/*_document.*")} == before


def test_the_warm_up_ends_with_the_rank_that_started_it(fresh_cache):
    rank = subprocess.run(
        [sys.executable, "-c", "from kaiyuan_recipes.data.cache_warmup import start_cache_warmup\n"
                               "print(start_cache_warmup('gpt_smoke', []).pid, flush=True)"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ))
    warmup = int(rank.stdout.split()[-1])
    deadline = time.monotonic() + 120
    while os.path.exists(f"/proc/{warmup}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{warmup}"), "the warm-up outlived its rank"
    assert prepared(fresh_cache) == []  # stopped, not finished
    assert no_half_written(fresh_cache)


def no_half_written(cache):
    return not list(cache.glob("tokenizers/.*")) and not list(cache.glob("sample_corpus/*/.*tmp*"))


def test_a_warm_up_the_rank_no_longer_needs_ends_and_leaves_nothing_half_written(fresh_cache):
    process = start_cache_warmup("gpt_smoke", [])
    time.sleep(3)  # somewhere in its work, or still importing: either way it must end cleanly
    finish_cache_warmup(process)  # what entry.main does once the plan is resolved or refused
    assert process.returncode in (143, -15)
    assert no_half_written(fresh_cache)
