"""datatrove's word-tokenizer table (datatrove 0.10.1, utils/word_tokenizers.py) marks which languages have a spaCy
model with the strings "TRUE" / "FALSE", and a non-empty "FALSE" reads as true: `zh` is then given spaCy's
multilingual `xx` tokenizer, which splits Chinese text on nothing but punctuation (a sentence is one "word"), instead
of the jieba-backed Chinese tokenizer the same table assigns to `cmn`. Gopher repetition, FineWeb and MinHash n-grams
on Chinese text then count sentences as words."""

from __future__ import annotations

# The codes that name the same Chinese tokenizer once the table is read as meant.
CHINESE_ALIAS = {"zh": "cmn"}


def word_tokenizer_language(language: str) -> str:
    """The language code to ask datatrove for, so that Chinese gets its Chinese word tokenizer."""
    return CHINESE_ALIAS.get(language, language)
