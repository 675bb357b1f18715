"""The read pipeline: records [start, stop) of reading plans, fetched and decoded ahead.

A `PlanReader` knows one dataset (its index, format, columns, storage and retry policy) and
turns runs of a plan into *parts*: what the format's `cut` gives for consecutive records
(an Arrow-backed column dict, a list of samples), cut so that every `step` records from
the start of a read end a part (a batch is then one part, or a few joined by `regroup`).

    (plan, start, stop) runs -> read groups (a piece's decode units), in the order the
                                reading first needs them, fetched and decoded by threads as
                                far ahead as the memory budget allows
                             -> slabs of up to SLAB records gathered from the groups held
                             -> parts of at most `step` records, in the plan's order

A plan reads each piece of a block group by group (sampler.plan), so the reader holds one
group of each of the block's `window` pieces (the working set) plus what it reads ahead:
the first records flow once the first group of each piece is decoded, not a whole block,
and a group is let go as soon as its piece moves on to its next group.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from sampler.plan import Chunk, Plan

from .formats import Format
from .index import ShardIndex
from .retry import RetryPolicy
from .stats import Stats, active, fetch_seconds
from .storage import filesystem

__all__ = ["DEFAULT_MEMORY_BUDGET", "SLAB", "MemoryBudget", "PlanReader", "Run"]

Run = tuple[Plan, int, int]  # records [start, stop) of a plan, in its reading order
Key = tuple[int, int, int]  # (run, piece, group): one read group of one run

SLAB = 2048  # records gathered at once from the groups held (then cut into parts)
CHUNK_RECORDS = 8192  # records of the reading order computed at once (small: the first
# records flow sooner, and the consumer thread does not hold the GIL long)
DEFAULT_MEMORY_BUDGET = 128 << 20  # see the README's measurement
# decoded bytes per estimated byte until a group is measured: encoded pages are often
# smaller than the decoded columns (dictionaries, run lengths), so start cautious
FIRST_SCALE = 2.0


class MemoryBudget:
    """A bound in bytes on the decoded data readers hold plus what they read ahead; one
    object may be shared by several readers (a mixture's streams) to bound them together.
    Thread-safe.

    A reader charges a group's estimated size when it starts reading it, its measured size
    once decoded, and refunds it when the group is let go. It reads ahead only while the
    charge fits; a group its consumer needs now is read even when it does not (the least
    memory the reading order allows), so `held` stays within `limit` plus the groups being
    waited for. `peak` is the most ever held.
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"memory_budget must be an int >= 0 (bytes), got {limit!r}")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def charge(self, n: int, force: bool = False) -> bool:
        """Hold n more bytes if they fit (or `force`); False, holding nothing more, if not."""
        with self._lock:
            if not force and self.held + n > self.limit:
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def refund(self, n: int) -> None:
        """Hold n fewer bytes (n < 0: more, e.g. when a group decoded larger than charged)."""
        with self._lock:
            self.held -= n
            self.peak = max(self.peak, self.held)


def budget_of(memory_budget: int | MemoryBudget | None) -> MemoryBudget:
    """A MemoryBudget from bytes (None: DEFAULT_MEMORY_BUDGET) or the shared object itself."""
    if isinstance(memory_budget, MemoryBudget):
        return memory_budget
    return MemoryBudget(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget)


class PlanReader:
    """Reads runs of plans over one ShardIndex, read group by read group.

    `read_threads` threads fetch and decode groups in the order the reading needs them,
    as far ahead as `memory_budget` allows (bytes, or a MemoryBudget shared with other
    readers; default DEFAULT_MEMORY_BUDGET). `prefetch` (deprecated, for one release):
    instead of a budget, read ahead `prefetch` more sets of the block's groups, as the
    old reader read `prefetch` more blocks. Counters go to `stats` (see loader.stats).
    """

    def __init__(
        self,
        index: ShardIndex,
        fmt: Format,
        *,
        columns: Sequence[str] | None,
        storage_options: dict[str, Any] | None,
        retry: RetryPolicy,
        read_threads: int,
        prefetch: int | None = None,
        memory_budget: int | MemoryBudget | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.index = index
        self.fmt = fmt
        self.columns = None if columns is None else list(columns)
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.read_threads = read_threads
        self.prefetch = prefetch
        self.budget = budget_of(memory_budget)
        self.stats = stats if stats is not None else Stats()
        self._lock = threading.Lock()
        self._measured = [0, 0]  # bytes decoded groups held, and what was estimated for them

    def parts(self, runs: Iterable[Run], step: int) -> Iterator[Any]:
        """The runs' records in reading order, in parts of at most `step` records that end
        at multiples of `step` records from the start (so batches are single parts)."""
        runs = list(runs)
        if not runs or not self.index.shards:
            return
        fs, _ = filesystem(self.index.shards[0].url, self.storage_options)
        slab = step * max(1, SLAB // step)
        reading = _Reading(self, fs, runs)
        self.fmt.reserve(reading.budget.limit + reading.budget.limit // 2)
        done = 0
        try:
            first = next(iter(reading.upcoming_key()), None)
            if self.fmt.first_read_alone and first is not None:
                reading.wait(first)  # decides what the others are checked against
            reading.pump()
            for r, (plan, a, b) in enumerate(runs):
                block: tuple[int, int] | None = None
                for chunk in plan.chunks(a, b, CHUNK_RECORDS):
                    if chunk.block != block:
                        if block is not None:
                            reading.let_go_block(r, block)
                        block = chunk.block
                    lo = 0
                    while lo < len(chunk):
                        hi = min(len(chunk), lo + slab - done % slab)
                        hi = _slab_end(chunk, lo, hi, step - done % step, step)
                        taken = reading.gather(r, chunk, lo, hi)
                        at = 0
                        while at < hi - lo:
                            end = min(hi - lo, at + step - done % step)
                            yield self.fmt.cut(taken, at, end)
                            done += end - at
                            at = end
                        lo = hi
                if block is not None:
                    reading.let_go_block(r, block)
        finally:
            reading.close()

    def estimate(self, shard_id: int, start: int, stop: int) -> tuple[int, int]:
        """(what the budget is charged, the format's own estimate) for reading rows
        [start, stop) of a shard: the format's estimate scaled by what decoded groups
        measured against their estimates so far."""
        shard = self.index.shards[shard_id]
        raw = self.fmt.estimate(shard, start, stop, self.columns)
        with self._lock:
            measured, estimated = self._measured
        scale = measured / estimated if estimated else FIRST_SCALE
        return max(1, int(raw * scale)), raw

    def load(self, fs: Any, shard_id: int, start: int, stop: int, entry: _Group) -> Any:
        """Read and decode rows [start, stop) of a shard (in a reader thread): the joined
        block, its measured size charged to the budget instead of the estimate."""
        shard = self.index.shards[shard_id]
        t0 = time.perf_counter()
        with active(self.stats):
            fetched = fetch_seconds()
            block = self.fmt.join([self.fmt.read(fs, shard, start, stop, self.columns)])
            fetched = fetch_seconds() - fetched
        self.stats.add("decode_s", time.perf_counter() - t0 - fetched)
        size = self.fmt.nbytes(block)
        self.budget.refund(entry.charged - size)
        entry.charged = size
        self.stats.add("peak_held_bytes", self.budget.peak)
        with self._lock:
            self._measured[0] += size
            self._measured[1] += entry.raw
        return block


def _slab_end(chunk: Chunk, lo: int, hi: int, first: int, step: int) -> int:
    """Where a slab starting at record `lo` of the chunk ends: at `hi`, or sooner where
    its records would touch more than two groups a piece on average (so that small groups
    are not all held at once), at the end of a part: `first` records after `lo`, then
    every `step`."""
    if chunk.groups is None or hi - lo <= first:
        return hi
    codes = (chunk.pieces[lo:hi] << 32) | chunk.groups[lo:hi]
    _, seen = np.unique(codes, return_index=True)  # where each group is first read
    limit = 2 * (chunk.block[1] - chunk.block[0])
    if seen.size <= limit:
        return hi
    cut = int(np.sort(seen)[limit])  # the first record of one group too many
    return lo + (first if cut <= first else first + (cut - first) // step * step)


class _Group:
    """One read group: its reading (`future`), its first row, and what it holds in the
    budget (`charged`: the estimate while it is read, then its measured size)."""

    __slots__ = ("charged", "first", "future", "raw")

    def __init__(self, first: int, charged: int, raw: int) -> None:
        self.first, self.charged, self.raw = first, charged, raw
        self.future: Future[Any] | None = None


class _Reading:
    """One `parts` call's groups: scheduled, being read, held; and when to let them go."""

    def __init__(self, reader: PlanReader, fs: Any, runs: list[Run]) -> None:
        self.reader, self.fs, self.runs = reader, fs, runs
        self.fmt, self.budget = reader.fmt, reader.budget
        self.pool = ThreadPoolExecutor(max_workers=reader.read_threads)
        self.schedule = self._schedule()
        self.upcoming: tuple[Key, Plan] | None = None
        self.groups: dict[Key, _Group] = {}
        self.current: dict[tuple[int, int], int] = {}  # (run, piece) -> the group read now
        if reader.prefetch is not None:
            self.budget = self._prefetch_budget(reader.prefetch)

    def _prefetch_budget(self, prefetch: int) -> MemoryBudget:
        """The deprecated `prefetch`: a budget of (1 + prefetch) times the first block's
        working set (the first group of each of its pieces), by the estimates."""
        first = list(itertools.islice(self.schedule, 4 * max(1, self.runs[0][0].window)))
        self.schedule = itertools.chain(first, self.schedule)
        seen: set[tuple[int, int]] = set()
        working = 0
        for (r, p, g), plan in first:
            if (r, p) not in seen and len(seen) < plan.window:
                seen.add((r, p))
                start, stop = plan.group_rows(p, g)
                working += self.reader.estimate(int(plan.shards[p]), start, stop)[0]
        return MemoryBudget((1 + prefetch) * working)

    def _schedule(self) -> Iterator[tuple[Key, Plan]]:
        """Every group the runs read, in the order their reading first needs them."""
        for r, (plan, a, b) in enumerate(self.runs):
            if a >= b:
                continue
            before = plan.block_starts()
            for bi in range(plan.block_at(a), plan.block_at(b - 1) + 1):
                lo, hi = max(a, before[bi]) - before[bi], min(b, before[bi + 1]) - before[bi]
                for p, g in plan.group_schedule(bi, int(lo), int(hi)):
                    yield (r, p, g), plan

    def upcoming_key(self) -> list[Key]:
        """The next scheduled group not yet being read (an empty list: none)."""
        if self.upcoming is None:
            self.upcoming = next(self.schedule, None)
        return [] if self.upcoming is None else [self.upcoming[0]]

    def pump(self, need: Key | None = None) -> None:
        """Start reading scheduled groups while their estimates fit the budget; with `need`
        (a group the consumer waits for), up to that one whatever the budget says."""
        while need is None or need not in self.groups:
            if self.upcoming is None:
                self.upcoming = next(self.schedule, None)
                if self.upcoming is None:
                    if need is not None:
                        raise RuntimeError(f"read group {need} is not in the reading schedule")
                    return
            (r, p, g), plan = self.upcoming
            start, stop = plan.group_rows(p, g)
            charge, raw = self.reader.estimate(int(plan.shards[p]), start, stop)
            if not self.budget.charge(charge, force=need is not None):
                return
            entry = _Group(start, charge, raw)
            entry.future = self.pool.submit(
                self.reader.load, self.fs, int(plan.shards[p]), start, stop, entry
            )
            self.groups[(r, p, g)] = entry
            self.upcoming = None

    def wait(self, key: Key) -> tuple[Any, int]:
        """(the decoded block of group `key`, its first row), reading it now if needed."""
        if key not in self.groups:
            self.pump(need=key)
        entry = self.groups[key]
        assert entry.future is not None
        if not entry.future.done():
            with self.reader.stats.timer("wait_s"):
                return entry.future.result(), entry.first
        return entry.future.result(), entry.first

    def gather(self, r: int, chunk: Chunk, lo: int, hi: int) -> Any:
        """Records [lo, hi) of the chunk, taken from the groups that hold them; then the
        groups the pieces have moved past are let go."""
        pieces, rows = chunk.pieces[lo:hi], chunk.rows[lo:hi]
        groups = chunk.groups[lo:hi] if chunk.groups is not None else np.zeros_like(rows)
        # (n,) one number per (piece, group), and which of the distinct ones each record reads
        codes, which = np.unique((pieces << 32) | groups, return_inverse=True)
        held = [self.wait((r, c >> 32, c & 0xFFFFFFFF)) for c in codes.tolist()]
        firsts = np.array([first for _, first in held], dtype=np.int64)
        taken = self.fmt.gather([b for b, _ in held], which, rows - firsts[which])
        # each piece's group at the end of the slab; its earlier groups are done
        last = np.unique(pieces[::-1], return_index=True)
        now = dict(zip(last[0].tolist(), groups[::-1][last[1]].tolist()))
        for c in codes.tolist():
            if now[c >> 32] != c & 0xFFFFFFFF:
                self.let_go((r, c >> 32, c & 0xFFFFFFFF))
        for p, g in now.items():
            old = self.current.get((r, p))
            if old is not None and old != g:
                self.let_go((r, p, old))
            self.current[(r, p)] = g
        self.pump()
        return taken

    def let_go(self, key: Key) -> None:
        """Group `key` is done: cancel its reading, or release its block and refund it."""
        entry = self.groups.pop(key, None)
        if entry is None or entry.future is None:
            return
        entry.future.cancel()
        entry.future.add_done_callback(functools.partial(self._settle, entry))

    def _settle(self, entry: _Group, f: Future[Any]) -> None:
        """(When its reading is over) release a let-go group's block and refund it."""
        if not f.cancelled() and f.exception() is None:
            self.fmt.release(f.result())
        self.budget.refund(entry.charged)

    def let_go_block(self, r: int, block: tuple[int, int]) -> None:
        """Let go of every group of run r's block [p0, p1) still held."""
        p0, p1 = block
        for key in [k for k in self.groups if k[0] == r and p0 <= k[1] < p1]:
            self.let_go(key)
        for p in range(p0, p1):
            self.current.pop((r, p), None)
        self.pump()

    def close(self) -> None:
        """Stop: cancel what is not read yet, wait for reads under way, release it all."""
        for key in list(self.groups):
            self.let_go(key)
        self.pool.shutdown(wait=True)
