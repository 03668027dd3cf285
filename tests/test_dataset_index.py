"""`kaiyuan data index` (training/dataset_index.py): a run's dataset indices built ahead of its launch with
megatron-core's own builder, into the cache the run reads. After it, the training path's dataset set-up (Bridge's
own functions, as pretrain's set-up calls them) builds nothing; a later curriculum phase is indexed for its own
samples; a SIGTERM mid-build adds nothing to the cache; a truncated index file is swept before a start."""

import json
import logging
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from kaiyuan_recipes.cli.main import main as kaiyuan
from kaiyuan_recipes.data.convert import ConvertOptions, convert_directory
from kaiyuan_recipes.data.index_cache import STAGING_PREFIX, npy_is_whole, sweep_incomplete
from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

GBS, SEQ = 16, 4096  # gpt_smoke's


def _convert(root, name):
    from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR

    src = root / f"in_{name}"
    src.mkdir()
    pq.write_table(pq.read_table(CORPUS_DIR / f"{name}.parquet"), src / f"{name}.parquet")
    convert_directory(ConvertOptions(input_dir=src, output_dir=root / name, tokenizer_dir=default_tokenizer_dir(),
                                     output_prefix=name, num_shards=1), show_progress=False)
    return root / name


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("index_data")
    return {name: _convert(root, name) for name in ("en_jargon", "zh_poems")}


def _curriculum(path, sources, steps):
    """Two shuffled phases of `steps` = (phase 1, phase 2) iterations: English, then Chinese."""
    phases = {n: {"tokens": GBS * SEQ * s, "order": "shuffled",
                  "sources": [{"name": name, "dir": str(sources[name]), "weight": "tokens"}]}
              for n, s, name in ((1, steps[0], "en_jargon"), (2, steps[1], "zh_poems"))}
    path.write_text(yaml.safe_dump({"seq_length": SEQ, "global_batch_size": GBS, "phases": phases}))
    return path


def _overrides(tmp_path, curriculum):
    return [f"kaiyuan.curriculum={curriculum}", f"kaiyuan.run_root={tmp_path / 'runs'}", "kaiyuan.run_name=cur",
            f"kaiyuan.tokenizer={default_tokenizer_dir()}"]


def _cache_files(cache):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.iterdir() if p.is_file()}


def training_set_up(overrides):
    """The datasets the training path builds for `kaiyuan train gpt_smoke --phase N overrides`, and megatron-core's
    dataset log records meanwhile: the config as the rank builds it (training/entry.py), resolved as pretrain
    resolves it, the tokenizer set and the provider bound as Bridge's setup does, Bridge's
    build_train_valid_test_datasets."""
    from megatron.bridge.data.loaders import build_train_valid_test_datasets
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.setup import _bind_dataset_provider_context
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from kaiyuan_recipes.training.config import build_config
    from kaiyuan_recipes.training.validate import resolve_with_upstream

    cfg, _ = build_config("gpt_smoke", overrides)
    cfg = resolve_with_upstream(cfg, world_size=1)
    tokenizer = build_tokenizer(cfg.tokenizer)
    cfg.dataset.tokenizer = tokenizer
    provider = _bind_dataset_provider_context(get_dataset_provider(cfg.dataset), tokenizer=tokenizer,
                                              pg_collection=None)
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("megatron.core.datasets")
    handler, level = Keep(logging.INFO), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        datasets = build_train_valid_test_datasets(cfg, provider)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return datasets, records, cfg


def test_the_prebuild_leaves_the_training_set_up_nothing_to_build(sources, tmp_path, capfd):
    from kaiyuan_recipes.cli.train import with_phase

    overrides = _overrides(tmp_path, _curriculum(tmp_path / "cur.yaml", sources, (30, 20)))
    assert kaiyuan(["data", "index", "gpt_smoke", "--phase", "1", *overrides]) == 0
    out = capfd.readouterr().out
    cache = tmp_path / "runs" / "cur" / "dataset_cache"
    assert f"building [train 1/1] {sources['en_jargon']}" in out and "built " in out, out
    built = _cache_files(cache)
    assert any(n.endswith("GPTDataset-train-shuffle_index.npy") for n in built), built
    assert not list(cache.glob(f"{STAGING_PREFIX}*"))

    (train, valid, _), records, _ = training_set_up(with_phase(1, overrides))
    assert not [r for r in records if r.startswith("Build and save")], records
    assert "Load the GPTDataset train indices" in records and "Load the GPTDataset valid indices" in records
    assert len(train) >= 30 * GBS and valid is not None
    assert _cache_files(cache) == built  # nothing written, nothing replaced

    assert kaiyuan(["data", "index", "gpt_smoke", "--phase", "1", *overrides]) == 0
    again = capfd.readouterr().out
    assert "every index this run reads is cached" in again and "  building [" not in again, again
    assert _cache_files(cache) == built


def test_a_later_phase_is_indexed_for_its_own_samples(sources, tmp_path, capfd):
    from kaiyuan_recipes.cli.train import with_phase

    overrides = _overrides(tmp_path, _curriculum(tmp_path / "cur.yaml", sources, (60, 20)))
    assert kaiyuan(["data", "index", "gpt_smoke", "--phase", "2", *overrides]) == 0
    out = capfd.readouterr().out
    phase1_samples, phase2_samples = 60 * GBS, 20 * GBS
    cache = tmp_path / "runs" / "cur" / "dataset_cache"
    [train_description] = cache.glob("*GPTDataset-train-description.txt")
    indexed = json.loads(train_description.read_text())["num_samples"]  # what megatron-core hashes
    # Phase 2's source indexed for phase 2's samples (megatron-core adds a margin per source), not phase 1's too.
    assert phase2_samples <= indexed < phase1_samples, (indexed, out)

    (train, _, _), records, cfg = training_set_up(with_phase(2, overrides))
    assert not [r for r in records if r.startswith("Build and save")], records
    assert cfg.train.train_iters * GBS == phase1_samples + phase2_samples
    # The resumed sampler starts at phase 1's consumed samples: that index is phase 2's first sample.
    assert len(train) >= phase1_samples + phase2_samples
    assert train[phase1_samples]["tokens"].shape[0] == SEQ
    with pytest.raises(IndexError, match="precedes this phase's first sample"):
        train[phase1_samples - 1]


def test_a_sigterm_mid_build_adds_nothing_to_the_cache(sources, tmp_path):
    # Enough samples over the small corpus (thousands of epochs) that the train index takes a while to build.
    overrides = _overrides(tmp_path, _curriculum(tmp_path / "cur.yaml", sources, (60_000, 20)))
    argv = [sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "index", "gpt_smoke", "--phase", "1",
            *overrides]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    for line in proc.stdout:  # bounded: the process ends after its output
        seen.append(line)
        if line.strip().startswith("building [train"):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=600)[0]
    output = "".join(seen) + rest
    assert proc.returncode == 143, output
    assert "stopped by SIGTERM: nothing was added to the cache" in output, output
    cache = tmp_path / "runs" / "cur" / "dataset_cache"
    assert not list(cache.glob(f"{STAGING_PREFIX}*"))  # the child's work is gone with it
    assert not list(cache.glob("*GPTDataset-train-*")), sorted(p.name for p in cache.iterdir())
    assert all(npy_is_whole(p) for p in cache.glob("*.npy"))


def test_a_truncated_index_file_is_swept_so_megatron_rebuilds_it(sources, tmp_path, capfd):
    from kaiyuan_recipes.cli.train import with_phase

    overrides = _overrides(tmp_path, _curriculum(tmp_path / "cur.yaml", sources, (30, 20)))
    assert kaiyuan(["data", "index", "gpt_smoke", "--phase", "1", *overrides]) == 0
    capfd.readouterr()
    cache = tmp_path / "runs" / "cur" / "dataset_cache"
    [shuffle] = cache.glob("*GPTDataset-train-shuffle_index.npy")
    whole = shuffle.stat().st_size
    with open(shuffle, "r+b") as f:  # what a process ended inside numpy.save leaves
        f.truncate(whole // 2)
    with pytest.raises(ValueError, match="mmap length"):  # megatron-core takes the entry for cached and fails
        training_set_up(with_phase(1, overrides))
    assert sweep_incomplete(cache) == [shuffle] and not shuffle.exists()
    (train, _, _), records, _ = training_set_up(with_phase(1, overrides))
    assert "Build and save the GPTDataset train indices" in records
    assert shuffle.stat().st_size == whole and sweep_incomplete(cache) == []


def test_a_blend_without_weights_is_indexed_one_epoch_per_source(sources, tmp_path, capfd):
    # dataset.blend=[[A,B],null]: megatron-core indexes each source for one epoch (num_samples None)
    prefixes = ",".join(str(next(sources[name].glob("*.idx")).with_suffix("")) for name in ("en_jargon", "zh_poems"))
    # a short sequence, so the small corpus's validation split holds a sample of each source
    assert kaiyuan(["data", "index", "gpt_smoke", "kaiyuan.data=blend", f"dataset.blend=[[{prefixes}],null]",
                    f"kaiyuan.run_root={tmp_path / 'runs'}", f"kaiyuan.tokenizer={default_tokenizer_dir()}",
                    "train.train_iters=10", "dataset.seq_length=256", "model.seq_length=256"]) == 0
    out = capfd.readouterr().out
    assert f"building [train 1/2] {sources['en_jargon']}" in out and ": one epoch over " in out, out
    assert "built " in out, out


def test_a_source_whose_validation_split_has_no_documents_is_refused_naming_it(tmp_path):
    """50 short documents at dataset.split 99,1,0 leave the validation split none; megatron-core asked it for
    samples looped forever (compat.refuse_an_empty_split)."""
    import pyarrow as pa

    src = tmp_path / "small_in"
    src.mkdir()
    pq.write_table(pa.table({"text": [f"hello world {i} " * 20 for i in range(50)]}), src / "small.parquet")
    convert_directory(ConvertOptions(input_dir=src, output_dir=tmp_path / "small", output_prefix="small",
                                     tokenizer_dir=default_tokenizer_dir(), num_shards=1), show_progress=False)
    prefix = next((tmp_path / "small").glob("*.idx")).with_suffix("")
    done = subprocess.run([sys.executable, "-m", "kaiyuan_recipes.cli.main", "data", "index", "gpt_smoke",
                           "kaiyuan.data=blend", f"dataset.blend=[[{prefix}],null]", "train.train_iters=10",
                           f"kaiyuan.run_root={tmp_path / 'runs'}"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout[-2000:]
    # refused by the data checks before any index is built (data/preflight.py); a rank that gets this far is
    # stopped by compat.refuse_an_empty_split (tests/test_compat.py)
    assert f"{prefix}: its validation split holds 0 document(s) at dataset.split 99,1,0" in done.stderr, \
        done.stderr[-3000:]
