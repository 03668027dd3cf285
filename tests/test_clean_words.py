"""The word tokenizer the cleaning steps share (kaiyuan_recipes/data/clean/words.py): the same words, sentences and
sentence spans as datatrove's own spaCy tokenizer, with spaCy's vocabulary kept between documents (bounded) and the
last document's words remembered, one instance shared by every heuristic and MinHash of the filter stage."""

from __future__ import annotations

import pickle

import pytest
from datatrove.utils.word_tokenizers import SpaCyTokenizer, load_word_tokenizer

from kaiyuan_recipes.data.clean.words import PersistentSpacyTokenizer, word_tokenizer

# Not a text holding the literal IS_ALPHA: datatrove's own sentences for it depend on what it tokenized before.
TEXTS = {
    "en": [
        "Dr. Smith's e-mail is j.smith@example.org; see https://example.org/a?b=1 for $3.50 (or 4,000 USD).\n"
        "It's 10:30 a.m. -- don't be late!!! Isn't it?  Visit www.example.com... Q&A: 1st, 2nd; 3rd.",
        "Über naïve café — “quoted” ‘text’ … 😀 #hashtag @user C++ and C# aren't the same; x=y+1.",
        "A line.\n\nA second paragraph. Another sentence here.\n",
        "Dr. Smith's e-mail is j.smith@example.org; see https://example.org/a?b=1 for $3.50 (or 4,000 USD).",
    ],
    "zh": ["我爱北京天安门，天安门上太阳升。伟大领袖毛主席，指引我们向前进！", "这是一个测试。Hello world 123。"],
}


@pytest.mark.parametrize("language", ["en", "zh"])
def test_same_words_sentences_and_spans_as_datatrove(language):
    theirs, ours = SpaCyTokenizer(language), PersistentSpacyTokenizer(language, max_strings=60)
    for _ in range(2):  # the second pass runs on a warm vocabulary (and across a fresh pipeline: max_strings=60)
        for text in TEXTS[language]:
            assert ours.word_tokenize(text) == theirs.word_tokenize(text)
            assert ours.sent_tokenize(text) == theirs.sent_tokenize(text)
            assert ours.span_tokenize(text) == theirs.span_tokenize(text)


def test_the_vocabulary_is_kept_between_documents_and_bounded():
    tok = PersistentSpacyTokenizer("en", max_strings=10_000)
    tok.word_tokenize("zorblat quimbix fendrel.")
    nlp = tok.tokenizer
    assert "quimbix" in nlp.vocab.strings  # datatrove's memory zone would have forgotten it
    words = " ".join(f"w{i}x" for i in range(10_001))
    tok.word_tokenize(words)
    assert tok.tokenizer is nlp and len(nlp.vocab.strings) > 10_000
    assert tok.word_tokenize("one more.") == ["one", "more", "."]
    assert tok.tokenizer is not nlp  # over the bound: a fresh pipeline
    assert "quimbix" not in tok.tokenizer.vocab.strings


def test_the_last_words_are_remembered_and_handed_out_as_copies():
    tok = PersistentSpacyTokenizer("en")
    first = tok.word_tokenize("The same text.")
    first.append("changed")
    nlp_calls = []
    tok._do_tokenize = lambda text: nlp_calls.append(text) or []
    assert tok.word_tokenize("The same text.") == ["The", "same", "text", "."]
    assert nlp_calls == []
    assert tok.word_tokenize("Another text.") == [] and nlp_calls == ["Another text."]


def test_pickled_without_its_pipeline():
    tok = PersistentSpacyTokenizer("en")
    tok.word_tokenize("Warm it up.")
    copy = pickle.loads(pickle.dumps(tok))
    assert copy._tokenizer is None and copy._last_text is None
    assert copy.word_tokenize("Warm it up.") == ["Warm", "it", "up", "."]


def test_datatrove_keeps_its_own_tokenizer_where_it_is_not_spacy_or_carries_a_fix():
    assert isinstance(word_tokenizer("en"), PersistentSpacyTokenizer)
    for language in ("en", "cmn"):  # datatrove's assignment, its spaCy language code and config
        theirs, ours = load_word_tokenizer(language), word_tokenizer(language)
        assert (ours.language, ours.config) == (theirs.language, theirs.config)
    # `zh`: the Chinese tokenizer datatrove assigns to `cmn` (compat.word_tokenizer_language)
    assert (word_tokenizer("zh").language, word_tokenizer("zh").config) == (load_word_tokenizer("cmn").language,
                                                                             load_word_tokenizer("cmn").config)
    assert word_tokenizer("ja") == "ja"  # datatrove's Japanese tokenizer with its memory-leak fix
    assert word_tokenizer("zho") == "zho"  # not a spaCy tokenizer (a whitespace one)


def test_one_tokenizer_for_every_heuristic_and_minhash(tmp_path):
    from datatrove.pipeline.dedup import MinhashDedupSignature

    from kaiyuan_recipes.data.clean.config import HEURISTICS, load_config
    from kaiyuan_recipes.data.clean.filters import WhitespaceWords
    from kaiyuan_recipes.data.clean.manifest import RunPlan
    from kaiyuan_recipes.data.clean.pipeline import build_stages

    plan = RunPlan(input_dir="in", output_dir="out", staging_dir=str(tmp_path), text_key="text", inputs=[],
                   config={}, config_hash="h", config_source="s", minhash=None, sample_removed=0, executor="local",
                   tasks=1, datatrove_version="x")
    import pyarrow as pa

    stages = build_stages(plan, load_config("web"), pa.schema([("text", pa.string())]), None)
    filter_stage = next(s for s in stages if s.name == "filter")
    names = dict(zip(filter_stage.labels, filter_stage.pipeline))
    used = [names[h].language for h in HEURISTICS if h in names and h != "gopher_quality"]
    used += [s.word_tokenizer for s in filter_stage.pipeline if isinstance(s, MinhashDedupSignature)]
    assert len(used) == 4 and isinstance(used[0], PersistentSpacyTokenizer)
    assert all(u is used[0] for u in used)
    # Gopher's quality rules count whitespace-separated words (filters.GopherQuality): no tokenizer at all
    assert isinstance(names["gopher_quality"].language, WhitespaceWords)


def test_token_counts_hold_a_small_batch_of_documents(tmp_path):
    """The counter yields its first document after reading a few hundred, not datatrove's default 10,000 (whose
    Encodings take about a gigabyte per worker for web-length documents)."""
    import pyarrow as pa
    from datatrove.data import Document
    from datatrove.pipeline.tokens import TokensCounter

    from kaiyuan_recipes.data.clean.config import load_config
    from kaiyuan_recipes.data.clean.manifest import RunPlan
    from kaiyuan_recipes.data.clean.pipeline import build_stages
    from kaiyuan_recipes.data.tokenizer import default_tokenizer_dir

    plan = RunPlan(input_dir="in", output_dir="out", staging_dir=str(tmp_path), text_key="text", inputs=[],
                   config={}, config_hash="h", config_source="s", minhash=None, sample_removed=0, executor="local",
                   tasks=1, datatrove_version="x")
    stages = build_stages(plan, load_config("web"), pa.schema([("text", pa.string())]),
                          str(default_tokenizer_dir() / "tokenizer.json"))
    counters = [s for s in next(s for s in stages if s.name == "filter").pipeline if isinstance(s, TokensCounter)]
    assert len(counters) == 2  # before the heuristics, and again after C4 rewrote lines
    for counter in counters:
        pulled = 0

        def documents():
            nonlocal pulled
            for i in range(20_000):
                pulled += 1
                yield Document("A short document of a few words.", str(i))

        first = next(counter.run(documents()))
        assert first.metadata["token_count"] > 0 and pulled <= 1_000


CHINESE = TEXTS["zh"][0]


def test_upstream_datatrove_still_splits_chinese_into_sentences_for_zh():
    """compat.word_tokenizer_language's canary: datatrove gives `zh` spaCy's multilingual tokenizer, which keeps a
    Chinese clause as one word. Fails once upstream gives `zh` its Chinese tokenizer: drop the workaround then."""
    words = load_word_tokenizer("zh").word_tokenize(CHINESE)
    assert max(len(w) for w in words) >= 7, words


def test_chinese_is_split_into_words():
    """The cleaning steps' `zh` tokenizer splits Chinese into words (jieba's), as the Chinese config needs."""
    words = word_tokenizer("zh").word_tokenize(CHINESE)
    assert {"北京", "天安门"} <= set(words), words
    assert max(len(w) for w in words) <= 4, words
