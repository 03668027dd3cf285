"""The default training data: the bundled corpus, tokenized on first use, builds real
megatron-core datasets for every split through Megatron-Bridge's own dataset provider."""

import numpy as np

from kaiyuan_recipes.data.sample_corpus import CORPUS_DIR, prepare_sample_corpus
from kaiyuan_recipes.training.config import build_config


def test_corpus_files_are_small_and_licensed():
    files = sorted(p.name for p in CORPUS_DIR.glob("*.parquet"))
    assert files == ["en_jargon.parquet", "zh_poems.parquet"]
    assert sum(p.stat().st_size for p in CORPUS_DIR.glob("*.parquet")) < 4 * 2**20
    assert "public domain" in (CORPUS_DIR / "rebuild.py").read_text()


def test_prepare_is_cached_and_weighted_by_tokens():
    prefixes, weights = prepare_sample_corpus()
    again, weights2 = prepare_sample_corpus()
    assert prefixes == again and weights == weights2
    assert len(prefixes) == 2 and all(w > 30_000 for w in weights)


def test_default_recipe_data_builds_train_valid_test(megatron_parallel):
    from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    cfg, run = build_config("gpt_smoke", ["dataset.split='98,2,0'"])
    assert run.data == "sample" and cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer"
    cfg.dataset.tokenizer = build_tokenizer(cfg.tokenizer)
    cfg.dataset.finalize()
    train, valid, test = pretrain_train_valid_test_datasets_provider([64, 16, 0], cfg.dataset)
    assert len(train) >= 64 and len(valid) >= 16 and test is None
    sample = train[0]
    tokens = np.asarray(sample["tokens"])
    assert tokens.shape == (4096,) and tokens.max() < 151646
    assert (np.asarray(sample["labels"])[:-1] == tokens[1:]).all()
    assert (tokens == 151643).any()  # documents are EOD-separated


def _build_as_pretrain(cfg):
    """The datasets Bridge's pretrain builds for `cfg`: the config as runtime_config_update leaves it, the
    tokenizer set, the provider Bridge picks, the sizes Bridge asks for."""
    from megatron.bridge.data.base import DatasetProvider
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from kaiyuan_recipes.training.validate import resolve_with_upstream

    resolved = resolve_with_upstream(cfg, world_size=1)
    tokenizer = build_tokenizer(resolved.tokenizer)
    resolved.dataset.tokenizer = tokenizer
    sizes = get_train_valid_test_num_samples(resolved)
    provider = get_dataset_provider(resolved.dataset)
    if isinstance(resolved.dataset, DatasetProvider):  # the protocol's adapter takes the tokenizer
        return provider(sizes, resolved.dataset, tokenizer=tokenizer), sizes
    return provider(sizes, resolved.dataset), sizes


def _tokens(dataset, i):
    return np.asarray(dataset[i]["tokens"])


def test_a_billion_token_recipe_on_the_sample_corpus_indexes_a_window_and_cycles(tmp_path):
    from kaiyuan_recipes.data.sample_window import SAMPLE_WINDOW_STEPS
    from kaiyuan_recipes.training.summary import data_description

    cfg, run = build_config("qwen3_1p7b", [f"kaiyuan.run_root={tmp_path}"])  # its defaults: 1,049,000 x 512
    # The plan says so (before the build: a run indexing all 537M samples would take many minutes here)
    assert f"repeated every {SAMPLE_WINDOW_STEPS:,} steps" in data_description(cfg, run)
    (train, valid, _), sizes = _build_as_pretrain(cfg)
    assert len(train) == sizes[0] == 1_049_000 * 512 and len(valid) == sizes[1]
    window = SAMPLE_WINDOW_STEPS * 512
    for i in (0, 7, window - 1):
        assert (_tokens(train, i) == _tokens(train, i + window)).all()
        assert (_tokens(train, i) == _tokens(train, i + 1000 * window)).all()
    assert not (_tokens(train, 0) == _tokens(train, 1)).all()
    # The index covers the window, not the run: megatron-core's sample index in the run's cache.
    cached = run.layout.dataset_cache.glob("*GPTDataset-train-sample_index.npy")
    sample_index = [np.load(p, mmap_mode="r") for p in cached]
    assert sample_index and sum(s.shape[0] - 1 for s in sample_index) < 2 * window


def test_a_restart_loads_the_cached_index(tmp_path):
    cfg, run = build_config("qwen3_1p7b", [f"kaiyuan.run_root={tmp_path}"])
    (train, _, _), _ = _build_as_pretrain(cfg)
    cached = {p: p.stat().st_mtime_ns for p in run.layout.dataset_cache.iterdir()}
    assert any(p.name.endswith("shuffle_index.npy") for p in cached)
    again, _ = build_config("qwen3_1p7b", [f"kaiyuan.run_root={tmp_path}"])
    (train2, _, _), _ = _build_as_pretrain(again)
    assert {p: p.stat().st_mtime_ns for p in run.layout.dataset_cache.iterdir()} == cached  # nothing rebuilt
    assert (_tokens(train, 123) == _tokens(train2, 123)).all()


def test_a_run_within_the_window_reads_megatrons_own_datasets(tmp_path):
    """gpt_smoke (200 steps) is inside the window: the same samples, in the same order, as Bridge's GPTDatasetConfig
    gives for the same blend."""
    cfg, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path / 'windowed'}"])  # imports Bridge as compat does
    from megatron.bridge.training.config import GPTDatasetConfig

    (train, valid, _), _ = _build_as_pretrain(cfg)
    plain, _ = build_config("gpt_smoke", [f"kaiyuan.run_root={tmp_path / 'plain'}"])
    d = plain.dataset
    plain.dataset = GPTDatasetConfig(seq_length=d.seq_length, blend=d.blend, split=d.split, random_seed=d.random_seed,
                                     reset_attention_mask=False, reset_position_ids=False, eod_mask_loss=False,
                                     path_to_cache=d.path_to_cache)
    (train0, valid0, _), _ = _build_as_pretrain(plain)
    assert (len(train), len(valid)) == (len(train0), len(valid0))
    for i in (0, 1, len(train) - 1):
        assert (_tokens(train, i) == _tokens(train0, i)).all()
    assert (_tokens(valid, 3) == _tokens(valid0, 3)).all()
