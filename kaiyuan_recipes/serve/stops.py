"""Stop strings, in one place for the engine and both contracts. Over a text that grows a piece at a time (a row's
tokens as they are decoded), in time linear in the text: the row's text is detokenized incrementally (a few tokens
per new token, not the whole text) and each stop string is matched by a Knuth-Morris-Pratt automaton that reads
every new character once. Searching the whole text again at each token, or asking at each token how much of its
end could still begin a stop, would cost the text's length (times a stop's) per token. A finished text is cut
once (cut_at_stop)."""

from __future__ import annotations

from typing import Callable


class Detokenizer:
    """A row's text, one token at a time: each token decodes a window of the last few tokens, not the text."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.ids, self.prefix, self.read = decode, [], 0, 0

    def add(self, token: int) -> str:
        """The text `token` adds ("" while a character is still incomplete: it comes with a later token)."""
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix:self.read])
        now = self.decode(self.ids[self.prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):  # a character still incomplete
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before):]


def _failure(stop: str) -> list[int]:
    """KMP's table: for each prefix stop[:i + 1], the length of its longest proper prefix that is also its suffix."""
    table, k = [0] * len(stop), 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = table[k - 1]
        if stop[i] == stop[k]:
            k += 1
        table[i] = k
    return table


class StopMatcher:
    """The first of `stops` in a text fed piece by piece: `feed` returns where it begins once one is complete, and
    `held_back` how many last characters could still begin one (text a stream must not send yet)."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self._tables = [_failure(s) for s in stops]
        self._states = [0] * len(stops)  # per stop: how many of its first characters the text now ends with
        self.length = 0  # characters fed
        self.found: int | None = None

    def feed(self, text: str) -> int | None:
        """Read `text` (what follows the text fed so far): the index in the whole text where the first stop string
        begins, once one has occurred (then it stays found), else None."""
        if self.found is not None or not text:
            return self.found
        for n, (stop, table) in enumerate(zip(self.stops, self._tables)):
            state = self._states[n]
            for at, char in enumerate(text):
                while state and stop[state] != char:
                    state = table[state - 1]
                if stop[state] == char:
                    state += 1
                if state == len(stop):  # complete: where it began
                    begin = self.length + at + 1 - len(stop)
                    self.found = begin if self.found is None else min(self.found, begin)
                    break
            self._states[n] = state
        self.length += len(text)
        return self.found

    def held_back(self) -> int:
        """How many last characters of the text could begin a stop string (0 once one is found)."""
        return 0 if self.found is not None else max(self._states, default=0)


class StopText:
    """A row's stop strings as its tokens arrive: each token's text (Detokenizer) fed to a StopMatcher. The engine
    ends a row once `found` is set; a stream sends all but the characters `held_back` (or up to `found`)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...]):
        self._text, self._matcher = Detokenizer(decode), StopMatcher(stops)

    def add(self, token: int) -> str:
        """The text `token` adds (read for stop strings)."""
        piece = self._text.add(token)
        self._matcher.feed(piece)
        return piece

    def ended_by(self, token: int) -> bool:
        """Add `token`: whether a stop string has occurred (with it or before)."""
        self.add(token)
        return self.found is not None

    @property
    def found(self) -> int | None:
        """Where the first stop string begins in the row's text, once one has occurred."""
        return self._matcher.found

    def held_back(self) -> int:
        return self._matcher.held_back()


def find_stop(text: str, stops: tuple[str, ...] | list[str]) -> int | None:
    """Where the first of `stops` begins in text (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str | None:
    """A finished text cut before its first stop string (never returned to the client); None when none occurs."""
    cut = find_stop(text, stops) if stops else None
    return None if cut is None else text[:cut]
