"""When and how the engine's work is taken up: when waiting requests join the running batch (JoinPolicy); fair
turns for items (requests waiting for a row, completions waiting to be scored) kept per call that submitted them
(an HTTP request's prompts x n choices are one call) and taken round-robin by call, one item per turn, so a call of
many items never holds the line against a later call of one; which rows give way when every row is taken and a
call holding none waits (rows_to_give_up); and the bound on what the engine holds at once (PendingLimit), past
which a new call is refused rather than queued without end."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class JoinPolicy:
    """When waiting requests join the running batch. Each join is one eager prefill, which stalls every
    decoding row for its duration, so joins are gathered: they happen when at least `min_rows` requests
    wait (or fill every free row), when the oldest has waited `max_wait_s`, or at once when no row decodes. With
    no row free, only the requests of calls that hold none count (a row gives way to each). min_rows 0: an
    eighth of the rows (at least 1)."""

    min_rows: int = 0
    max_wait_s: float = 0.25

    def rows_for(self, max_batch: int) -> int:
        return self.min_rows or max(1, max_batch // 8)


class RoundRobin(Generic[T]):
    """Items by call (an int), taken one per call in turn; a call with nothing left leaves the rotation. Used by
    one thread (the engine's worker)."""

    def __init__(self) -> None:
        self._calls: collections.OrderedDict[int, collections.deque[T]] = collections.OrderedDict()
        self._count = 0

    def add(self, call: int, item: T) -> None:
        self._calls.setdefault(call, collections.deque()).append(item)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def heads(self) -> Iterator[tuple[int, T]]:
        """Each call with its next item (the oldest of each call)."""
        return ((call, items[0]) for call, items in self._calls.items())

    def put_back(self, call: int, item: T) -> None:
        """`item` first in its call's line again (a row that gave way resumes before its call's later items)."""
        self._calls.setdefault(call, collections.deque()).appendleft(item)
        self._count += 1

    def take_of(self, call: int) -> T:
        """`call`'s oldest item, out of turn; that call goes to the back of the rotation. KeyError if it has none."""
        items = self._calls[call]
        item = items.popleft()
        self._count -= 1
        if items:
            self._calls.move_to_end(call)
        else:
            del self._calls[call]
        return item

    def take(self) -> T:
        """The next call's oldest item; that call goes to the back of the rotation. IndexError when empty."""
        if not self._calls:
            raise IndexError("nothing waits")
        return self.take_of(next(iter(self._calls)))

    def take_all(self) -> Iterator[T]:
        while self._calls:
            yield self.take()


def rows_to_give_up(rows_by_call: dict[int, list[int]], newcomers: int) -> list[int]:
    """The rows that give way to `newcomers` calls holding none, when no row is free: one row each, every time from
    the call holding the most rows (its first listed: the caller lists the cheapest to resume first), never a
    call's last row. So a large call never keeps a later small one waiting for one of its own rows to end, and
    every call keeps at least one row. rows_by_call: each call's rows (slots); it is not changed."""
    held = {call: list(slots) for call, slots in rows_by_call.items()}
    out: list[int] = []
    for _ in range(newcomers):
        call = max(held, key=lambda c: len(held[c]), default=None)
        if call is None or len(held[call]) < 2:
            break
        out.append(held[call].pop(0))
    return out


class EngineBusy(RuntimeError):
    """The engine holds as much work as it may: the call was refused, not queued (retry later)."""


class PendingLimit:
    """How many requests the engine holds unfinished (waiting, decoding or being scored), at most `limit`; a call
    whose requests would pass it is refused, unless the engine holds nothing (a call larger than the limit is
    served alone rather than never). Each request counts until its future is done."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"the engine's queue bound must be at least 1, got {limit}")
        self.limit, self.held = limit, 0
        self._lock = threading.Lock()

    def admit(self, count: int) -> None:
        with self._lock:
            if self.held and self.held + count > self.limit:
                raise EngineBusy(f"the server holds {self.held} unfinished requests (at most {self.limit}); "
                                 f"this call adds {count}: retry later")
            self.held += count

    def release(self, *_: object) -> None:  # a future's done-callback
        with self._lock:
            self.held -= 1
