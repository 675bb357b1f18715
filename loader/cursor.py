"""Where the consumer is: the items (records, or batches) a dataset object has handed out
in the epoch, in this process, and the hand-out loop that counts them.

The count must be exact even when the consumer stops in the middle of a list of records
(a resume state is taken there), and the hand-out must run no Python code per item (it is
the hot path of record mode): each delivery is a list whose own iterator is handed to
``itertools.chain``, and the list iterator tells how many it still holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from operator import length_hint
from typing import Any

from .stats import FIELDS

__all__ = ["Cursor"]

_WAIT, _WALL, _RECORDS = (
    FIELDS.index(f) for f in ("consumer_wait_s", "consumer_wall_s", "records")
)


def _batch_rows(batch: Mapping[str, Any]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


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
    ) -> Iterator[Iterator[Any]]:
        """An iterator over each delivery's items, in turn: a list's own iterator (a list of
        records, or of one batch with `batches`), or, for a generator of records, one that
        counts them one by one. `row` (this process's stats row) counts the records and,
        when `timed`, the consumer's waits; `tick` runs once a delivery (logging), `done`
        when the deliveries end."""
        ready = time.perf_counter()
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
                row[_RECORDS] += _batch_rows(items[0]) if batches else len(items)
                it = iter(items)
                self._live = (it, len(items))
                yield it
                self.position += len(items)
                self._live = None
            else:
                yield self._counted(items, row)

    def _counted(self, records: Iterator[Any], row: Any) -> Iterator[Any]:
        for record in records:
            self.position += 1
            row[_RECORDS] += 1
            yield record
