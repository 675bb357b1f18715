"""Round trips before the first item: which storage requests a reader made before it
handed out its first item, and how many of them stood in line (each sent only after the
one before it was answered).

On an object store each request in line costs a round trip (20-100 ms on a real store);
requests in flight together cost one. So what decides how soon a rank starts is the
longest chain of requests in line, not their number: `in_line` gives it.

A `Window` collects the spans of the requests made while it is open (sent and answered),
in any thread of this process: `StreamingDataset`/`MixtureDataset` open one around their
construction (listing, the index's load, footers, the staleness check) and one from a
pass's start to its first item; `loader.stats` reports their sum as ``first_requests``
and ``first_in_line``. The object-store reads (loader.storage.ranged_get, .gcs, .azure) wrap
each request, once it has a connection slot, in `trip`; a listing counts as one request
(its pages are not seen), a local file as none. With no window open, `trip` records
nothing. The reader notes each group it takes (`took`): a chain counts only requests
answered before the last group it took (reads ahead answered while the first item was
being made were not waited for).
"""

from __future__ import annotations

import heapq
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from fsspec.implementations.local import LocalFileSystem

__all__ = ["Window", "in_line", "took", "trip", "trip_to"]

_KEEP = 100_000  # spans a window keeps at most (a window left open by an error is bounded)
_lock = threading.Lock()
# open windows; weak, so a construction that raised leaves none behind
_open: weakref.WeakSet[Window] = weakref.WeakSet()


class Window:
    """The spans of the storage requests made in this process while it is open (from its
    making to `close`)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.start = time.monotonic()
        self.taken: float | None = None  # when the reader last took data it waited for
        with _lock:
            _open.add(self)

    def close(self) -> tuple[int, int]:
        """Stop collecting; (requests made, the longest chain of them in line). Where the
        reader took data while it was open (`took`), the chain ends with a request answered
        by then: one answered later was not waited for (reads ahead, sent once the first
        groups came and answered while the consumer was still making its first item: 3 in
        line where 2 stood, on a loaded machine)."""
        with _lock:
            _open.discard(self)
        waited = [s for s in self.spans if self.taken is None or s[1] <= self.taken]
        return len(self.spans), in_line(waited)


def took() -> None:
    """The reader took a group it had waited for (loader.read.reading): each open window
    notes when. Nothing once no window is open (after the first item)."""
    if _open:
        now = time.monotonic()
        with _lock:
            for window in _open:
                window.taken = now


class _Trip:
    """Times one request (or `n` sent together) into the windows open when it was sent and
    still open when it ends: a request in flight when a window opens is not one it waited
    for (a listing page sent ahead and dropped, still in flight after the construction,
    chained with the pass's first reads: 3 in line where 2 stood)."""

    __slots__ = ("n", "t0", "windows")

    def __init__(self, n: int) -> None:
        self.n = n
        self.t0 = 0.0
        self.windows: list[Window] = []

    def __enter__(self) -> None:
        self.t0 = time.monotonic()
        with _lock:
            self.windows = list(_open)

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        span = (self.t0, time.monotonic())
        with _lock:
            for window in self.windows:
                if window in _open and len(window.spans) < _KEEP:
                    window.spans.extend([span] * self.n)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, e, tb)


class _Nothing:
    """`trip` with no window open: records nothing."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass

    async def __aenter__(self) -> None:
        pass

    async def __aexit__(self, *exc: object) -> None:
        pass


_NOTHING = _Nothing()


def trip(n: int = 1) -> _Trip | _Nothing:
    """A context manager (``with`` or ``async with``) around one storage request, or `n`
    sent together, that records its span in every open `Window`."""
    return _Trip(n) if _open else _NOTHING


def trip_to(fs: Any, n: int = 1) -> _Trip | _Nothing:
    """`trip(n)` for requests to `fs`; nothing for a local filesystem (no round trip)."""
    return _NOTHING if isinstance(fs, LocalFileSystem) else trip(n)


def in_line(spans: Iterable[tuple[float, float]]) -> int:
    """The longest chain of requests each of which began after the one before it ended:
    the round trips waited for one after another. Spans in order of their start; a heap of
    those still open gives, at each start, the longest chain that ended before it."""
    ended = 0  # longest chain among the requests ended before the current start
    running: list[tuple[float, int]] = []  # (end, chain length ending with it)
    for start, end in sorted(spans):
        while running and running[0][0] <= start:
            ended = max(ended, heapq.heappop(running)[1])
        heapq.heappush(running, (end, ended + 1))
    return max([ended, *(n for _, n in running)])
