"""Where the loader's time goes: counters per process, summed over DataLoader workers.

Every process that reads (the main process iterating directly, or each DataLoader worker)
counts into its own row of a small shared-memory table that the dataset creates, so the main
process sums every worker's counts without any message passing (a worker started with fork
or spawn writes the same table: torch sends the tensor's shared memory to it).

Counted: records yielded, shard bytes fetched, storage requests and retries; seconds spent
fetching (in storage calls, summed over reader threads), decoding (reading Parquet or tar
into memory, minus the fetching in it; local Parquet reads count as decoding: pyarrow
reads and decodes in one call), waiting (the consuming thread blocked on a read not done
yet); before a reader's first item, the storage requests it (and the dataset's
construction) made, how many of them stood in line, and the seconds it took; and, where
the consumer is timed (`timed`, or iterating without workers), the seconds the consumer
spent waiting for the loader against its wall time: the data-stall fraction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "FIELDS",
    "LoaderStats",
    "Stats",
    "active",
    "current",
    "fetch_seconds",
    "summary",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Summed over processes (the table's columns, in this order).
FIELDS = (
    "records",  # items' records handed to the consumer
    "bytes_fetched",  # shard bytes read from storage (not those the node cache served)
    "requests",  # storage reads (ranged GETs, local row-group reads)
    "retries",  # failed storage reads tried again
    "fetch_s",  # seconds in storage reads, summed over reader threads
    "decode_s",  # seconds decoding, summed over reader threads
    "wait_s",  # seconds the consuming thread waited for a group still being read
    "consumer_wait_s",  # seconds the consumer waited inside next() (timed consumers)
    "consumer_wall_s",  # seconds from a timed consumer's first next() to its last
    "peak_held_bytes",  # the most bytes a reader of this process held (max, not summed)
    "cache_hit_bytes",  # shard bytes served by the node cache instead of storage
    # before a reader's first item (loader.storage.trips), the most of any reader:
    "first_requests",  # storage requests made (the dataset's construction's too)
    "first_in_line",  # of them, the longest chain each sent after the last was answered
    "first_item_s",  # seconds from the pass's start to its first item
)
_MAX = frozenset({"peak_held_bytes", "first_requests", "first_in_line", "first_item_s"})
SLOTS = 65  # rows: the main process, then up to 64 DataLoader workers


class Stats:
    """One process's counters: a row of the shared table (or a private row)."""

    def __init__(self, row: np.ndarray | None = None) -> None:
        self.row = row if row is not None else np.zeros(len(FIELDS), dtype=np.float64)
        self._lock = threading.Lock()  # reader threads add concurrently

    def add(self, field: str, value: float) -> None:
        i = FIELDS.index(field)
        with self._lock:
            if field in _MAX:
                self.row[i] = max(self.row[i], value)
            else:
                self.row[i] += value

    @contextmanager
    def timer(self, field: str) -> Iterator[None]:
        """Add the block's seconds to `field` (fetch time also to this thread's tally, see
        `fetch_seconds`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t0
            self.add(field, spent)
            if field == "fetch_s":
                _local.fetch = getattr(_local, "fetch", 0.0) + spent


_local = threading.local()
_NOWHERE = Stats()  # counts made outside any reader go here and are never reported


def current() -> Stats:
    """The Stats the calling thread counts into (set by `active`)."""
    stats: Stats | None = getattr(_local, "stats", None)
    return stats if stats is not None else _NOWHERE


@contextmanager
def active(stats: Stats) -> Iterator[None]:
    """Count the storage reads this thread makes inside the block into `stats`."""
    before = getattr(_local, "stats", None)
    _local.stats = stats
    try:
        yield
    finally:
        _local.stats = before


def fetch_seconds() -> float:
    """Seconds this thread has spent in storage reads so far (to take out of a decode time)."""
    spent: float = getattr(_local, "fetch", 0.0)
    return spent


def summary(totals: dict[str, float]) -> str:
    """One line: records/s-independent totals and the shares that say where time went."""
    stall = totals.get("stall_fraction")
    stall_text = "n/a" if stall is None else f"{stall:.1%}"
    return (
        (
            f"{int(totals['records']):,} records, {totals['bytes_fetched'] / 1e6:,.1f} MB in "
            f"{int(totals['requests']):,} requests ({int(totals['retries'])} retried); "
            f"fetch {totals['fetch_s']:.2f}s, decode {totals['decode_s']:.2f}s, reader wait "
            f"{totals['wait_s']:.2f}s; data stall {stall_text}; peak held "
            f"{totals['peak_held_bytes'] / 2**20:,.1f} MiB"
        )
        + (
            f"; cache served {totals['cache_hit_bytes'] / 1e6:,.1f} MB"
            if totals.get("cache_hit_bytes")
            else ""
        )
        + (
            f"; first item after {int(totals['first_requests'])} requests, "
            f"{int(totals['first_in_line'])} in line"
            if totals.get("first_requests")
            else ""
        )
    )


class LoaderStats:
    """The shared table of one dataset: row 0 for the main process, row 1 + w for DataLoader
    worker w. Picklable (the tensor travels as shared memory), so workers get the table."""

    def __init__(self) -> None:
        self._table = torch.zeros((SLOTS, len(FIELDS)), dtype=torch.float64).share_memory_()  # type: ignore[no-untyped-call]
        self._mine: Stats | None = None
        self._slot = -1
        self._last_log = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"_table": self._table}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._table = state["_table"]
        self._mine, self._slot, self._last_log = None, -1, 0.0

    def mine(self, slot: int) -> Stats:
        """This process's row (slot 0: no worker; 1 + w: worker w). Workers past the table's
        size count into a private row that is not reported (a warning says so once)."""
        if self._mine is None or self._slot != slot:
            self._slot = slot
            if slot < SLOTS:
                self._mine = Stats(self._table[slot].numpy())
            else:
                log.warning(
                    "stats: DataLoader worker %d is past the %d whose counts are kept; its "
                    "counts are not reported",
                    slot - 1,
                    SLOTS - 1,
                )
                self._mine = Stats()
        return self._mine

    def totals(self) -> dict[str, float]:
        """The counters summed over this process and its workers, plus `stall_fraction`
        (consumer wait over consumer wall time; None when no consumer was timed)."""
        table = self._table.numpy()
        out = {
            f: float(table[:, i].max() if f in _MAX else table[:, i].sum())
            for i, f in enumerate(FIELDS)
        }
        wall = out["consumer_wall_s"]
        out["stall_fraction"] = out["consumer_wait_s"] / wall if wall > 0 else None  # type: ignore[assignment]
        return out

    def reset(self) -> None:
        """Zero every counter (for this process and its workers)."""
        self._table.zero_()

    def maybe_log(self, every: float | None) -> None:
        """Log the one-line summary if `every` seconds passed since the last one."""
        if not every:
            return
        now = time.monotonic()
        if now - self._last_log >= every:
            if self._last_log:
                log.info("loader: %s", summary(self.totals()))
            self._last_log = now

    def timed(
        self, items: Iterable[T], stats: Stats, on_item: Callable[[], None] | None = None
    ) -> Iterator[T]:
        """`items`, timing each next() as the consumer's wait; the time between them (the
        consumer's own work) counts only in its wall time."""
        it = iter(items)
        t_start = time.perf_counter()
        wait_i, wall_i = FIELDS.index("consumer_wait_s"), FIELDS.index("consumer_wall_s")
        row = stats.row
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            row[wait_i] += t1 - t0
            row[wall_i] += t1 - t_start
            t_start = t1
            if on_item is not None:
                on_item()
            yield item
