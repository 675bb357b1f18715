"""Where the consumer is: the items (records, or batches) a dataset object has handed out
in the epoch, in this process, and the hand-out loop that counts them.

The count must be exact even when the consumer stops in the middle of a list of records
(a resume state is taken there), and the hand-out must run no Python code per item (it is
the hot path of record mode): each delivery is a list whose own iterator is handed to
``itertools.chain``, and the list iterator tells how many it still holds. `first_noted`
counts the storage requests made before a pass's first delivery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sized
from operator import length_hint
from typing import Any

from .stats import FIELDS, Stats
from .storage.trips import Window

__all__ = ["Cursor", "first_noted", "rows_of"]

_WAIT, _WALL, _RECORDS = (
    FIELDS.index(f) for f in ("consumer_wait_s", "consumer_wall_s", "records")
)


def rows_of(batch: object) -> int | None:
    """The rows a batch holds, where that can be told: a dict's first value's length, an
    array's or tensor's first dimension, a list of records' length, or a tuple's (or list
    of arrays') first element's rows; None for anything else (a scalar, a string)."""
    if isinstance(batch, Mapping):
        return rows_of(next(iter(batch.values()))) if batch else None
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if isinstance(batch, list | tuple) and batch:
        first = batch[0]
        if isinstance(batch, list) and not hasattr(first, "shape"):
            return len(batch)  # a list of records (or of values)
        return rows_of(first)
    return len(batch) if isinstance(batch, Sized) and not isinstance(batch, str | bytes) else None


class Cursor:
    """Items handed out in this epoch: `position` plus what the live list's iterator has
    given since it was handed out."""

    def __init__(self) -> None:
        self.position = 0
        self._live: tuple[Iterator[Any], int] | None = None  # the list being handed out

    def reset(self, position: int = 0) -> None:
        self.position, self._live = position, None

    def consumed(self) -> int:
        """Items handed out, exact in the middle of a list too."""
        if self._live is None:
            return self.position
        it, n = self._live
        return self.position + n - length_hint(it)

    def hand_out(
        self,
        deliveries: Iterator[Any],
        row: Any,
        *,
        batches: bool,
        timed: bool,
        tick: Callable[[], None] | None,
        done: Callable[[], None],
        total: int,
    ) -> Iterator[Iterator[Any]]:
        """An iterator over each delivery's items, in turn: a list's own iterator (a list of
        records, or of one batch with `batches`), or, for a generator of records, one that
        counts them one by one. `row` (this process's stats row) counts the records and,
        when `timed`, the consumer's waits; `tick` runs once a delivery (logging). `done`
        runs when the delivery holding the pass's last item (of `total`, counted as
        `position`) is handed out, not when the consumer asks past it: a loop that takes
        ``len(loader)`` items and starts again has finished its pass too."""
        ready = time.perf_counter()
        if self.position >= total:
            done()
        while True:
            t0 = time.perf_counter()
            items = next(deliveries, None)
            if items is None:
                done()
                return
            if timed:
                t1 = time.perf_counter()
                row[_WAIT] += t1 - t0
                row[_WALL] += t1 - ready
                ready = t1
            if tick is not None:
                tick()
            if isinstance(items, list):
                row[_RECORDS] += (rows_of(items[0]) or 0) if batches else len(items)
                n = len(items)
                last = n > 0 and self.position + n >= total  # holds the pass's last item
                it = iter(items[:-1] if last else items)
                self._live = (it, n - last)
                yield it
                self.position += n - last
                self._live = None
                if last:  # the last item alone, so that the pass ends when it is taken
                    yield self._final(items[-1], done)
            else:
                yield self._counted(items, row, done, total)

    def _final(self, item: Any, done: Callable[[], None]) -> Iterator[Any]:
        self.position += 1
        done()
        yield item

    def _counted(
        self, records: Iterator[Any], row: Any, done: Callable[[], None], total: int
    ) -> Iterator[Any]:
        for record in records:
            self.position += 1
            row[_RECORDS] += 1
            if self.position == total:
                done()
            yield record


def first_noted(
    deliveries: Iterator[Any], stats: Stats, window: Window, built: tuple[int, int]
) -> Iterator[Any]:
    """The deliveries; at the first, the storage requests made before it go into `stats`
    (loader.storage.trips): those `window` saw since the pass began, plus `built` (the
    dataset's construction's: requests, in line)."""
    for item in deliveries:
        n, line = window.close()
        stats.add("first_requests", built[0] + n)
        stats.add("first_in_line", built[1] + line)
        stats.add("first_item_s", time.monotonic() - window.start)
        yield item
        break
    window.close()
    yield from deliveries
