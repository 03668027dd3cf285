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
