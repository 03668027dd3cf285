"""Fair turns for the engine's work: items (requests waiting for a row, completions waiting to be scored) kept per
call that submitted them (an HTTP request's prompts x n choices are one call) and taken round-robin by call, one
item per turn, so a call of many items never holds the line against a later call of one; and the bound on what
the engine holds at once (PendingLimit), past which a new call is refused rather than queued without end."""

from __future__ import annotations

import collections
import threading
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


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

    def heads(self) -> Iterator[T]:
        """Each call's next item (the oldest of each call)."""
        return (items[0] for items in self._calls.values())

    def take(self) -> T:
        """The next call's oldest item; that call goes to the back of the rotation. IndexError when empty."""
        if not self._calls:
            raise IndexError("nothing waits")
        call, items = next(iter(self._calls.items()))
        item = items.popleft()
        self._count -= 1
        if items:
            self._calls.move_to_end(call)
        else:
            del self._calls[call]
        return item

    def take_all(self) -> Iterator[T]:
        while self._calls:
            yield self.take()


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
