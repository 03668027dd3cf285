"""Our variants of two datatrove quality filters, each a subclass that changes one documented thing and otherwise runs
datatrove's own rules:

- GopherQuality: the Gopher paper's rules (Rae et al. 2021, appendix A.1.1) are stated over words ("80 % of words in
  a document contain at least one alphabetic character", mean word length 3 to 10, 50 to 100,000 words), and words
  are whitespace-separated in the paper's reading that Dolma's Gopher tagger implements (`text.split()`). datatrove
  applies the rules to its word tokenizer's tokens, where every `,` `.` `(` `$` `=` is a "word" of its own: prose
  with commas and numbers falls under the 80 % bound, and text with formulas fails it entirely. `words: whitespace`
  (the default here) counts Gopher's words; `words: tokenizer` is datatrove's count.
- C4Lines: C4's line filter rewrites every document it keeps (it drops short lines, headings, blank lines, lines
  naming javascript or a policy). `rewrite_lines: false` keeps the document's text as written and uses the line rules
  only to decide; either way the documents changed and characters removed are counted for the manifest."""

from __future__ import annotations

from typing import Any

from datatrove.data import Document
from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter
from datatrove.utils.word_tokenizers import WordTokenizer

from kaiyuan_recipes.data.clean.stat_keys import CHARS_REMOVED, REWRITTEN

WORDS = ("whitespace", "tokenizer")


class WhitespaceWords(WordTokenizer):
    """Words as the Gopher paper counts them: maximal runs of non-whitespace characters ("f(x)=2", "3.5%", "end.").
    Only word splitting is defined: Gopher's quality rules use nothing else."""

    def __init__(self) -> None:
        super().__init__("whitespace")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        raise NotImplementedError("whitespace words split no sentences")

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        raise NotImplementedError("whitespace words split no sentences")


class GopherQuality(GopherQualityFilter):
    OWN_PARAMS = {"words": WORDS}

    def __init__(self, words: str = "whitespace", **kwargs: Any):
        if words not in WORDS:
            raise ValueError(f"words: expected one of {WORDS}, got {words!r}")
        if words == "whitespace":
            kwargs["language"] = WhitespaceWords()
        super().__init__(**kwargs)
        self.words = words


class C4Lines(C4QualityFilter):
    OWN_PARAMS = {"rewrite_lines": (True, False)}

    def __init__(self, rewrite_lines: bool = True, **kwargs: Any):
        if not isinstance(rewrite_lines, bool):
            raise ValueError(f"rewrite_lines: expected true or false, got {rewrite_lines!r}")
        super().__init__(**kwargs)
        self.rewrite_lines = rewrite_lines

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        before = doc.text
        kept = super().filter(doc)
        if kept is True and doc.text != before:
            if self.rewrite_lines:
                self.stat_update(REWRITTEN)
                self.stat_update(CHARS_REMOVED, value=len(before) - len(doc.text))
            else:
                doc.text = before
        return kept
