"""The word tokenizer the cleaning steps share: datatrove's spaCy tokenizer for the config's language, used the way a
batch pipeline can afford, through datatrove's extension point for it (a WordTokenizer passed as `language`).

datatrove's SpaCyTokenizer runs every text inside spaCy's `memory_zone`, which forgets every word the text added to
the vocabulary: each word of each document then goes through the tokenizer's prefix / suffix / infix rules and gets
its lexeme attributes computed again, about four times the cost of a warm vocabulary. And the Gopher, FineWeb and
MinHash steps each split a document into words, while datatrove's 5-entry split cache is flushed in between by C4's
per-line sentence splits. PersistentSpacyTokenizer is the same blank spaCy pipeline (same language config, same
sentencizer, the same tokens and sentences) keeping its vocabulary from one document to the next, bounded by a fresh
pipeline when it holds more than `max_strings` strings, and remembering the words of the last text it split."""

from __future__ import annotations

from typing import Any

from datatrove.utils.word_tokenizers import SpaCyTokenizer, load_word_tokenizer, strip_strings

from kaiyuan_recipes.compat.datatrove import word_tokenizer_language

# A new word costs spaCy about 450 bytes (its string, lexeme and tokenizer-cache entry): 500,000 of them are about
# 220 MB per worker, and a fresh pipeline costs a fraction of a second.
MAX_STRINGS = 500_000

# datatrove's Japanese tokenizer carries its own memory-leak fix: it keeps datatrove's memory-zone path
KEEP_DATATROVE = ("ja",)


class PersistentSpacyTokenizer(SpaCyTokenizer):
    def __init__(self, language: str, max_strings: int = MAX_STRINGS):
        super().__init__(language)
        self.max_strings = max_strings
        self._last_text: str | None = None
        self._last_words: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        # the tasks receive the step unpickled: each builds its own pipeline on first use
        return self.__dict__ | {"_tokenizer": None, "_last_text": None, "_last_words": []}

    def _bounded(self) -> None:
        if self._tokenizer is not None and len(self._tokenizer.vocab.strings) > self.max_strings:
            self._tokenizer = None

    def word_tokenize(self, text: str) -> list[str]:
        if text != self._last_text:
            self._bounded()
            self._last_words = strip_strings([token.text for doc in self._do_tokenize(text) for token in doc])
            self._last_text = text
        return list(self._last_words)

    def sent_tokenize(self, text: str) -> list[str]:
        self._bounded()
        return strip_strings([sent.text for doc in self._do_tokenize(text) for sent in doc.sents])

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        self._bounded()
        spans: list[tuple[int, int]] = []
        for doc in self._do_tokenize(text):
            start = spans[-1][1] if spans else 0
            spans += [(start + sent.start_char, start + sent.end_char) for sent in doc.sents]
        return spans


def word_tokenizer(language: str) -> Any:
    """What the filters and MinHash take as `language`: ours where datatrove assigns its spaCy tokenizer, else the
    language code itself (datatrove then loads its own tokenizer for it)."""
    language = word_tokenizer_language(language)
    theirs = load_word_tokenizer(language)
    if type(theirs) is SpaCyTokenizer and theirs.language not in KEEP_DATATROVE:
        return PersistentSpacyTokenizer(theirs.language)
    return language
