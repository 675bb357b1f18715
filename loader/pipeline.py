"""The read pipeline: records [start, stop) of reading plans, fetched and decoded ahead.

A `PlanReader` knows one dataset (its index, format, columns, storage and retry policy) and
turns runs of a plan into *parts*: what the format's `cut` gives for consecutive records
(an Arrow-backed column dict, a list of samples), cut so that every `step` records from
the start of a read end a part (a batch is then one part, or a few joined by `regroup`).

    (plan, start, stop) runs -> read groups (a piece's decode units), in the order the
                                reading first needs them: fetched by `read_threads`
                                threads as far ahead as the memory budget allows (off
                                local disk), decoded a few ahead by decoding threads, or
                                by the consumer when it needs them (loader.decoding:
                                local files on 2 cores have no decoding thread)
                             -> slabs of up to SLAB records gathered from the groups held
                             -> parts of at most `step` records, in the plan's order

A plan reads each piece of a block group by group (sampler.plan), so the reader holds one
group of each of the block's `window` pieces (the working set) plus what it reads ahead:
the first records flow once the first group of each piece is decoded, not a whole block,
and a group is let go as soon as its piece moves on to its next group. The reading order is
computed a chunk ahead on a thread of its own, except where no thread decodes (local files
on 2 cores): there the consumer does everything itself (a thread would only take the GIL
from it).

The memory budget is loader.budget; who decodes a group, and when, loader.decoding.

For a mixture of streams, give each stream's reader one shared MemoryBudget (so the bound
holds for all of them together); each reader still reads its own stream's groups in its
own order.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from sampler.plan import Chunk, Plan

from .budget import DEFAULT_MEMORY_BUDGET, MemoryBudget, budget_of
from .decoding import _Ahead, _finish, _Group, _Stopped, decode_threads, decoding_pool
from .errors import ShardError, redact
from .formats import Format
from .formats.columns import ConversionError
from .index import ShardIndex
from .retry import RetryPolicy
from .stats import Stats, active, fetch_seconds
from .storage import filesystem

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "SLAB",
    "MemoryBudget",
    "PlanReader",
    "Run",
    "decode_threads",
    "decoding_pool",
    "is_local",
]

Run = tuple[Plan, int, int]  # records [start, stop) of a plan, in its reading order
Key = tuple[int, int, int]  # (run, piece, group): one read group of one run

SLAB = 2048  # records gathered at once from the groups held (then cut into parts)
CHUNK_RECORDS = 32768  # records of the reading order computed at once (small: the first
# records flow sooner, and the consumer thread does not hold the GIL long)
# decoded bytes per estimated byte until a group is measured: encoded pages are often
# smaller than the decoded columns (dictionaries, run lengths), so start cautious
FIRST_SCALE = 2.0


def is_local(index: ShardIndex, storage_options: dict[str, Any] | None) -> bool:
    """Whether the index's shards are local files."""
    if not index.shards:
        return True
    fs, _ = filesystem(index.shards[0].url, dict(storage_options or {}))
    return isinstance(fs, LocalFileSystem)


class PlanReader:
    """Reads runs of plans over one ShardIndex, read group by read group.

    `read_threads` threads fetch groups in the order the reading needs them, as far ahead
    as `memory_budget` allows (bytes, or a MemoryBudget shared with other readers, e.g. a
    mixture's streams; default DEFAULT_MEMORY_BUDGET); `decode_threads()` threads decode
    them a few ahead of need, and the consumer decodes a group itself when none has.
    `prefetch` (deprecated, for one release): instead of a budget,
    read ahead `prefetch` more sets of the first block's groups, as the old reader read
    `prefetch` more blocks. Counters go to `stats` (see loader.stats). `decoders`: a
    decoding pool shared with other readers (a mixture's streams: their decoding then takes
    the cores a single reader's would, not that many times over; its owner shuts it down);
    by default each `parts` call starts its own.
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
        decoders: ThreadPoolExecutor | None = None,
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
        self.decoders = decoders
        self._lock = threading.Lock()
        self._measured = [0, 0]  # bytes decoded groups held, and what was estimated for them

    def parts(self, runs: Iterable[Run], step: int) -> Iterator[Any]:
        """The runs' records in reading order, in parts of at most `step` records that end
        at multiples of `step` records from the start (so batches are single parts)."""
        runs = list(runs)
        if not runs or not self.index.shards:
            return
        fs, _ = filesystem(self.index.shards[0].url, self._options())
        slab = step * max(1, SLAB // step)
        reading = _Reading(self, fs, runs)
        self.fmt.reserve(reading.budget.limit + reading.budget.limit // 2)
        done = 0
        try:
            reading.pump()
            for r, (plan, a, b) in enumerate(runs):
                block: tuple[int, int] | None = None
                for chunk in reading.ahead_of(plan.chunks(a, b, CHUNK_RECORDS)):
                    if chunk.block != block:
                        if block is not None:
                            reading.let_go_block(r, block)
                        block = chunk.block
                    lo = 0
                    while lo < len(chunk):
                        hi = min(len(chunk), lo + slab - done % slab)
                        hi, groups = reading.slab_end(r, chunk, lo, hi, step - done % step, step)
                        taken = reading.gather(r, chunk, lo, hi, groups)
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

    @property
    def local(self) -> bool:
        """Whether the shards are local files (no fetching ahead pays: see `_Reading`)."""
        return is_local(self.index, self.storage_options)

    def _options(self) -> dict[str, Any]:
        """The storage options, with room for `read_threads` S3 connections unless the
        caller chose a pool size (s3fs's client keeps 10)."""
        if not self.index.shards[0].url.startswith(("s3://", "s3a://")):
            return self.storage_options
        config = dict(self.storage_options.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", max(10, self.read_threads))
        return {**self.storage_options, "config_kwargs": config}

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

    def fetch(self, fs: Any, entry: _Group) -> None:
        """Fetch a group's bytes (in a fetching thread), then queue it for decoding (see
        `_Ahead`); its future gets the joined block, or None if it was let go first.
        Off local disk, the later groups of the same shard already started are fetched
        with it (up to FETCH_BYTES stored): fewer, larger requests, as object stores want."""
        together = entry.ahead.claim(entry)
        if not together:
            return  # an earlier fetch of its shard took it along
        if entry.ahead.halted:  # a read failed, or reading stopped: start nothing more
            for e_ in together:
                _finish(e_, None, _Stopped("an earlier read failed, or reading stopped"))
            return
        try:
            shard = self.index.shards[entry.shard]
            rows = [(e.first, e.stop) for e in together]
            with active(self.stats):
                raws = self.fmt.fetch_many(fs, shard, rows, self.columns)
        except BaseException as e:
            # the reads queued behind this one start nothing: the error reaches the
            # consumer after the reads in flight, not after each queued one has spent its
            # own retries
            entry.ahead.halted = True
            for e_ in together:
                _finish(e_, None, e)
            return
        for e_, raw in zip(together, raws):
            entry.ahead.fetched(e_, raw)

    def decode(self, fs: Any, entry: _Group, raw: Any) -> Any:
        """Decode and join one group (in a decoding thread: the same few threads decode
        every group, so Arrow's allocator keeps free memory in few thread heaps), and
        charge the budget its measured size instead of the estimate."""
        with active(self.stats):
            t0 = time.perf_counter()
            fetched = fetch_seconds()  # local files are read while decoding
            try:
                block = self.fmt.join([self.fmt.decode(fs, raw)])
            except ConversionError as e:
                url = redact(self.index.shards[entry.shard].url)
                where = f"column {e.column!r}, row {entry.first + e.row} of the shard"
                raise ShardError(f"{url}: {where}: {e.cause}") from e
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


def _distinct(chunk: Chunk, lo: int, hi: int) -> tuple[list[tuple[int, int]], Any, Any, Any]:
    """The groups records [lo, hi) of the chunk read: (their (piece, group) keys; (n,) which
    of them each record reads; (k,) where each is first read; (k,) where last). One
    counting pass over small dense codes (np.unique would sort)."""
    n = hi - lo
    pieces = chunk.pieces[lo:hi] - chunk.block[0]
    groups = chunk.groups[lo:hi] if chunk.groups is not None else np.zeros(n, dtype=np.int64)
    width = int(groups.max()) + 1 if n else 1
    dense = pieces * width + groups  # (n,) a small code per (piece, group)
    present = np.flatnonzero(np.bincount(dense))  # (k,) the codes read, ascending
    index = np.empty(int(present[-1]) + 1 if present.size else 0, dtype=np.int64)
    index[present] = np.arange(present.size)
    which = index[dense]
    at = np.arange(n, dtype=np.int64)
    last = np.empty(present.size, dtype=np.int64)
    last[which] = at  # repeated indices: the last assignment stays
    first = np.empty(present.size, dtype=np.int64)
    first[which[::-1]] = at[::-1]
    keys = [(chunk.block[0] + d // width, d % width) for d in present.tolist()]
    return keys, which, first, last


class _Reading:
    """One `parts` call's groups: scheduled, being read, held; and when to let them go."""

    def __init__(self, reader: PlanReader, fs: Any, runs: list[Run]) -> None:
        self.reader, self.fs, self.runs = reader, fs, runs
        self.fmt, self.budget = reader.fmt, reader.budget
        self.pool = ThreadPoolExecutor(max_workers=reader.read_threads)
        self.schedule = self._schedule()
        self.upcoming: tuple[Key, int, int, int, int, int] | None = None
        self.groups: dict[Key, _Group] = {}
        self.current: dict[tuple[int, int], int] = {}  # (run, piece) -> the group read now
        window = max((plan.window for plan, _, _ in runs), default=1)
        self.shared = reader.decoders is not None
        local = isinstance(fs, LocalFileSystem)
        self.decoders = reader.decoders or decoding_pool(local)
        self.planner = ThreadPoolExecutor(max_workers=1)
        threads = decode_threads(local)
        self.ahead = _Ahead(window + threads, self.decoders, reader, fs, threads)
        self.submitted = 0  # groups started, in reading order
        # local files with no decoding threads: the consumer also fetches (a local fetch
        # only finds the row groups; the decode reads the file) and plans, as a thread
        # of its own would take the GIL from it for as long (measured: -0.1 us a record)
        self.inline = local and not threads
        # inline: groups started but not fetched yet, in reading order; each is fetched
        # when the consumer reaches it (a tar group's fetch reads its bytes: fetching the
        # whole budget first would make the first record wait for all of them)
        self.unread: collections.deque[_Group] = collections.deque()
        if reader.prefetch is not None:
            self.budget = self._prefetch_budget(reader.prefetch)

    def ahead_of(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        """The chunks, each next one computed by the planning thread while this one is
        read (the reading order costs ~0.3 us a record: not on the consuming thread);
        computed here when the consumer does all the work anyway (`inline`)."""
        if self.inline:
            yield from chunks
            return
        coming = self.planner.submit(next, chunks, None)
        while True:
            chunk = coming.result()
            if chunk is None:
                return
            coming = self.planner.submit(next, chunks, None)
            yield chunk

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

    def pump(self, need: Key | None = None) -> None:
        """Start reading scheduled groups while their estimates fit the budget; with `need`
        (a group the consumer waits for), up to that one whatever the budget says. The
        groups started in one call are all registered before any fetch begins, so a fetch
        can take along the later groups of its shard (see `_Ahead.claim`)."""
        started: list[_Group] = []
        try:
            self._start(need, started)
        finally:
            self.ahead.started(started)
            for entry in started:
                if self.inline:
                    self.unread.append(entry)
                else:
                    self.pool.submit(self.reader.fetch, self.fs, entry)

    def _start(self, need: Key | None, started: list[_Group]) -> None:
        while need is None or need not in self.groups:
            if self.upcoming is None:
                self.upcoming = self._next_scheduled()
                if self.upcoming is None:
                    if need is not None:
                        raise RuntimeError(f"read group {need} is not in the reading schedule")
                    return
            key, shard, start, stop, charge, raw = self.upcoming
            if not self.budget.charge(charge, force=need is not None):
                return
            self.submitted += 1
            entry = _Group(self.submitted, shard, (start, stop), (charge, raw), self.ahead)
            entry.stored = self.fmt.piece_bytes(self.reader.index.shards[shard], start, stop)
            started.append(entry)
            self.groups[key] = entry
            self.upcoming = None

    def _next_scheduled(self) -> tuple[Key, int, int, int, int, int] | None:
        """(key, shard, first row, stop, charge, own estimate) of the next scheduled group:
        estimated once, however often it waits for room in the budget."""
        nxt = next(self.schedule, None)
        if nxt is None:
            return None
        (r, p, g), plan = nxt
        shard = int(plan.shards[p])
        start, stop = plan.group_rows(p, g)
        charge, raw = self.reader.estimate(shard, start, stop)
        return (r, p, g), shard, start, stop, charge, raw

    def wait(self, key: Key) -> tuple[Any, int]:
        """(the decoded block of group `key`, its first row), reading it now if needed."""
        if key not in self.groups:
            self.pump(need=key)
        entry = self.groups[key]
        while self.unread and not entry.claimed:  # inline: fetch in reading order, up to it
            self.reader.fetch(self.fs, self.unread.popleft())
        if not entry.needed:
            self.ahead.need(entry)
        if not entry.future.done():
            with self.reader.stats.timer("wait_s"):
                here, raw = self.ahead.take(entry)
                if here:  # its bytes wait for a decoding thread: this one is idle anyway
                    self.ahead.decode_here(entry, raw)
                block = entry.future.result()
        else:
            block = entry.future.result()
        if not entry.checked:  # in reading order: checks that depend on what came before
            entry.checked = True
            self.fmt.check(block, self.reader.index.shards[entry.shard])
        return block, entry.first

    def slab_end(
        self, r: int, chunk: Chunk, lo: int, hi: int, first: int, step: int
    ) -> tuple[int, tuple[list[tuple[int, int]], Any, Any, Any]]:
        """(where a slab of run r starting at record `lo` of the chunk ends, its `_distinct`
        groups): at `hi`, or at the end of an earlier part (`first` records after `lo`, then
        every `step`) where its records would touch more than two groups a piece on average
        (small groups are not all held at once), or a group not decoded yet: beyond the
        first part, a slab waits for no read."""
        found = _distinct(chunk, lo, hi)
        keys, _, seen, _ = found
        cut = hi - lo
        limit = 2 * (chunk.block[1] - chunk.block[0])
        if len(keys) > limit:
            cut = int(np.sort(seen)[limit])  # the first record of one group too many
        for key, at in zip(keys, seen.tolist()):
            entry = self.groups.get((r, *key))
            if at >= first and at < cut and (entry is None or not entry.future.done()):
                cut = at
        end = lo + (first if cut <= first else first + (cut - first) // step * step)
        if end >= hi:
            return hi, found
        return end, _distinct(chunk, lo, end)

    def gather(
        self,
        r: int,
        chunk: Chunk,
        lo: int,
        hi: int,
        found: tuple[list[tuple[int, int]], Any, Any, Any],
    ) -> Any:
        """Records [lo, hi) of the chunk, taken from the groups that hold them (`found`:
        `_distinct` of them); then the groups the pieces have moved past are let go."""
        keys, which, _, last = found
        for p, g in keys:  # all needed now: their decoding need not wait for the cushion
            entry = self.groups.get((r, p, g))
            if entry is not None and not entry.needed:
                self.ahead.need(entry)
        held = [self.wait((r, p, g)) for p, g in keys]
        firsts = np.array([first for _, first in held], dtype=np.int64)
        rows = chunk.rows[lo:hi]
        taken = self.fmt.gather([b for b, _ in held], which, rows - firsts[which])
        # each piece's group at the end of the slab (read last); its earlier ones are done
        now: dict[int, tuple[int, int]] = {}
        for (p, g), end in zip(keys, last.tolist()):
            if p not in now or end > now[p][1]:
                now[p] = (g, end)
        for p, g in keys:
            if now[p][0] != g:
                self.let_go((r, p, g))
        for p, (g, _) in now.items():
            old = self.current.get((r, p))
            if old is not None and old != g:
                self.let_go((r, p, old))
            self.current[(r, p)] = g
        self.pump()
        return taken

    def let_go(self, key: Key) -> None:
        """Group `key` is done: cancel its reading, or release its block and refund it."""
        entry = self.groups.pop(key, None)
        if entry is None:
            return
        if self.inline and entry in self.unread:  # never fetched: nothing to wait for
            self.unread.remove(entry)
            entry.claimed = True
            _finish(entry, None)
        self.ahead.need(entry, drop=True)
        entry.future.add_done_callback(functools.partial(self._settle, entry))

    def _settle(self, entry: _Group, f: Future[Any]) -> None:
        """(When its reading is over) release a let-go group's block and refund it."""
        if f.exception() is None and f.result() is not None:
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
        self.ahead.halted = True
        for key in list(self.groups):
            self.let_go(key)
        self.pool.shutdown(wait=True)
        if not self.shared:
            self.decoders.shutdown(wait=True)
        self.planner.shutdown(wait=True)
