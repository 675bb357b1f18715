"""One `PlanReader.parts` call's reading (loader.read.plan_reader): which read groups are
scheduled, being read and held, when each is fetched and decoded, and when it is let go.
"""

from __future__ import annotations

import collections
import functools
import itertools
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shardstream.sampler.plan import Chunk, Plan

from ..columns.gather import Selection
from ..formats.deferred import is_deferred
from ..storage.trips import took
from .budget import MemoryBudget
from .decoding import Ahead, decode_threads, decoding_pool
from .groups import Group, GroupReader, finish
from .readahead import ReadAhead, reads_ahead
from .slabs import Run, distinct_groups, first_block_pieces

__all__ = ["Key", "Reading", "Run"]

Key = tuple[int, int, int]  # (run, piece, group): one read group of one run


class Reading:
    """One `parts` call's groups: scheduled, being read, held; and when to let them go."""

    def __init__(self, reader: GroupReader, fs: Any, runs: list[Run]) -> None:
        self.reader, self.fs, self.runs = reader, fs, runs
        self.fmt, self.budget = reader.fmt, reader.budget
        self.pool = ThreadPoolExecutor(max_workers=reader.read_threads)
        self.schedule = self._schedule()
        self.upcoming: tuple[Key, int, int, int, int, int] | None = None
        self.groups: dict[Key, Group] = {}
        self.current: dict[tuple[int, int], int] = {}  # (run, piece) -> the group read now
        window = max((plan.window for plan, _, _ in runs), default=1)
        self.shared = reader.decoders is not None
        local = isinstance(fs, LocalFileSystem)
        self.decoders = reader.decoders or decoding_pool(local)
        self.planner = ThreadPoolExecutor(max_workers=1)
        threads = decode_threads(local)
        self.ahead = Ahead(window + threads, self.decoders, reader, fs, threads)
        self.submitted = 0  # groups started, in reading order
        # local files with no decoding threads: the consumer also fetches (a local fetch
        # only finds the row groups; the decode reads the file) and plans, as a thread
        # of its own would take the GIL from it for as long (measured: -0.1 us a record)
        self.inline = local and not threads
        # inline: groups started but not fetched yet, in reading order; each is fetched
        # when the consumer reaches it (a tar group's fetch reads its bytes: fetching the
        # whole budget first would make the first record wait for all of them)
        self.unread: collections.deque[Group] = collections.deque()
        # local Parquet: pyarrow reads the groups on a thread of their own; so does remote
        # Parquet the node cache holds (read through the cache: cached epochs read at
        # about local disk's speed, not the remote path's)
        cached = not local and reads_ahead(self.fmt) and self._cached()
        self.local = (
            ReadAhead(reader, fs, reader.cache if cached else None)
            if (local or cached) and reads_ahead(self.fmt)
            else None
        )
        if self.local is not None:
            self.inline = True  # the consumer plans; nothing is fetched ahead
        # until the first slab is gathered, only the first block's first group of each piece
        # (and what the slab needs), then what the budget allows: fetched ahead (remote), or
        # read by a thread shared with other readers (a mixture's local streams, each first).
        # The block's pieces, not the window: a stream of fewer shards than the window
        # otherwise queued its pieces' second groups before the next stream's first (the
        # bench's mixture: 19 reads before its first batch, where it needs 14)
        opening = first_block_pieces(runs)
        self.opening = opening if not self.inline or (self.local and reader.readers) else 0
        if reader.prefetch is not None:
            self.budget = self._prefetch_budget(reader.prefetch)

    def _cached(self) -> bool:
        """Whether the reader's node cache holds all the stored bytes the runs read (an
        epoch after the first, as a rule: their footers in memory, or in the cache, nothing
        fetched to decide): then they are read from it on a reading thread, and the checks
        of their shards against the remote start now, all at once."""
        cache = self.reader.cache
        if cache is None:
            return False
        fmt: Any = self.fmt  # Parquet's
        shards = self.reader.index.shards
        pieces = [
            (sid, lo, hi)
            for plan, a, b in self.runs
            if a < b
            for sid, lo, hi in zip(plan.shards.tolist(), plan.starts.tolist(), plan.stops.tolist())
        ]
        columns = self.reader.columns
        got = [fmt.stored_ranges(self.fs, shards[sid], lo, hi, columns) for sid, lo, hi in pieces]
        lacking = {sid: shards[sid] for (sid, _, _), g in zip(pieces, got) if g is None}
        if lacking:  # footers this process does not hold: the cache may
            if not self._footers_from(cache, lacking):
                return False
            got = [fmt.stored_ranges(self.fs, shards[s], lo, hi, columns) for s, lo, hi in pieces]
        urls: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        indexed: list[tuple[int, str | None]] = []
        for (sid, _, _), ranges in zip(pieces, got):
            if ranges is None:
                return False
            shard = shards[sid]
            urls += [shard.url] * len(ranges[0])
            starts += ranges[0]
            ends += ranges[1]
            indexed += [(shard.bytes, shard.version)] * len(ranges[0])
        if not cache.holds(urls, starts, ends, indexed):
            return False
        ids = list(dict.fromkeys(sid for sid, _, _ in pieces))  # the shards read, in order
        versions = [(shards[i].bytes, shards[i].version) for i in ids]
        cache.check_ahead(self.fs, [shards[i].url for i in ids], versions, len(shards))
        return True

    def _footers_from(self, cache: Any, lacking: dict[int, Any]) -> bool:
        """Whether the footers of the `lacking` shards are now in memory, read from the node
        cache where it holds each of these shards whole (fetched by a rank of the node that
        read them before: with `locality="node"` a node's ranks trade shards from epoch to
        epoch, and an index loaded from a file brings no footer). Nothing is fetched, and
        the remote is not asked (the rows are confirmed before they are handed out)."""
        fmt: Any = self.fmt  # Parquet's
        for shard in lacking.values():
            if is_deferred(shard):
                return False
            whole = cache.mapped(shard.url, (shard.bytes, shard.version), shard.bytes)
            if whole is None:
                return False
            footer = whole.slice(shard.bytes - int(shard.details["footer_bytes"]))
            fmt.metadata(self.fs, shard, footer.to_pybytes())
        return True

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

    def pump(self, *need: Key) -> None:
        """Start reading scheduled groups while their estimates fit the budget; with `need`
        (groups the consumer waits for), up to the last of them whatever the budget says.
        The groups started in one call are all registered before any fetch begins, so a
        fetch can take along the later groups of its shard (see `Ahead.claim`)."""
        missing = {k for k in need if k not in self.groups}
        if need and not missing:
            return
        started: list[Group] = []
        try:
            self._start(missing, started)
        finally:
            self._started(started)

    def _started(self, started: list[Group]) -> None:
        """The groups `pump` started, handed to what reads them."""
        if self.local is not None:
            self.local.add(started)
            return
        self.ahead.started(started)
        for entry in started:
            if self.inline:
                self.unread.append(entry)
            else:
                self.pool.submit(self.reader.fetch, self.fs, entry)

    def _start(self, need: set[Key], started: list[Group]) -> None:
        ahead = not need  # (else up to the last group needed)
        while ahead or need:
            if self.upcoming is None:
                self.upcoming = self._next_scheduled()
                if self.upcoming is None:
                    if need:
                        raise RuntimeError(f"read groups {need} are not in the reading schedule")
                    return
            key, shard, start, stop, charge, raw = self.upcoming
            if ahead and self.local is not None and len(started) >= self.local.room():
                return  # (see ReadAhead.room)
            if ahead and 0 < self.opening <= self.submitted:
                return  # (see `opening`)
            if not self.budget.charge(charge, force=not ahead):
                return
            need.discard(key)
            self.submitted += 1
            entry = Group(self.submitted, shard, (start, stop), (charge, raw), self.ahead)
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
            self.pump(key)
        entry = self.groups[key]
        if self.local is not None:
            if not entry.future.done():
                with self.reader.stats.timer("wait_s"):
                    self.local.until(entry)
            return self._checked(entry)
        while self.unread and not entry.claimed:  # inline: fetch in reading order, up to it
            self.reader.fetch(self.fs, self.unread.popleft())
        if not entry.needed:
            self.ahead.need(entry)
        if not entry.future.done():
            with self.reader.stats.timer("wait_s"):
                here, raw = self.ahead.take(entry)
                if here:  # its bytes wait for a decoding thread: this one is idle anyway
                    self.ahead.decode_here(entry, raw)
        return self._checked(entry)

    def _checked(self, entry: Group) -> tuple[Any, int]:
        """(`entry`'s decoded block, its first row), checked when first taken."""
        block = entry.future.result()
        if not entry.checked:  # in reading order: checks that depend on what came before
            entry.checked = True
            self.fmt.check(block, self.reader.index.shards[entry.shard])
        took()  # a first item's round trips in line end with what it waited for (trips)
        return block, entry.first

    def slab_end(
        self, r: int, chunk: Chunk, lo: int, hi: int, first: int, step: int
    ) -> tuple[int, tuple[list[tuple[int, int]], Any, Any, Any]]:
        """(where a slab of run r starting at record `lo` of the chunk ends, its `distinct_groups`
        groups): at `hi`, or at the end of an earlier part (`first` records after `lo`, then
        every `step`) where its records would touch more than two groups a piece on average
        (small groups are not all held at once), or a group not decoded yet: beyond the
        first part, a slab waits for no read."""
        found = distinct_groups(chunk, lo, hi)
        keys, _, seen, _ = found
        cut = hi - lo
        limit = 2 * (chunk.block[1] - chunk.block[0])
        if len(keys) > limit:
            cut = int(np.sort(seen)[limit])  # the first record of one group too many
        for key, at in zip(keys, seen.tolist()):
            entry = self.groups.get((r, *key))
            # (read ahead in reading order while the slab is made: as good as ready)
            ready = entry is not None and (self.local is not None or entry.future.done())
            if at >= first and at < cut and not ready:
                cut = at
        end = lo + (first if cut <= first else first + (cut - first) // step * step)
        if end >= hi:
            return hi, found
        return end, distinct_groups(chunk, lo, end)

    def gather(
        self,
        r: int,
        chunk: Chunk,
        lo: int,
        hi: int,
        found: tuple[list[tuple[int, int]], Any, Any, Any],
        select: bool = False,
    ) -> Any:
        """Records [lo, hi) of the chunk, taken from the groups that hold them (`found`:
        `distinct_groups` of them), or (`select`) a Selection of them, taken later; then the
        groups the pieces have moved past are let go."""
        keys, which, _, last = found
        self.pump(*[(r, p, g) for p, g in keys])  # all needed: started together
        for p, g in keys:  # their decoding need not wait for the cushion
            entry = self.groups[(r, p, g)]
            if not entry.needed:
                self.ahead.need(entry)
        held = [self.wait((r, p, g)) for p, g in keys]
        firsts = np.array([first for _, first in held], dtype=np.int64)
        rows = chunk.rows[lo:hi]
        blocks = [b for b, _ in held]
        taken = (Selection if select else self.fmt.gather)(blocks, which, rows - firsts[which])
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
        self.opening = 0
        self.pump()
        return taken

    def let_go(self, key: Key) -> None:
        """Group `key` is done: cancel its reading, or release its block and refund it."""
        entry = self.groups.pop(key, None)
        if entry is None:
            return
        if self.local is not None:
            self.local.drop(entry)
        elif self.inline and entry in self.unread:  # never fetched: nothing to wait for
            self.unread.remove(entry)
            entry.claimed = True
            finish(entry, None)
        self.ahead.need(entry, drop=True)
        entry.future.add_done_callback(functools.partial(self._settle, entry))

    def _settle(self, entry: Group, f: Future[Any]) -> None:
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

    def close(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        """Stop: cancel what is not read yet, wait for reads under way, release it all.
        Nothing when the interpreter exits (a reading left mid-way, closed as its generator
        is collected): its threads are gone, module globals None (hence `finalizing`)."""
        if finalizing():
            return
        self.ahead.halted = True
        for key in list(self.groups):
            self.let_go(key)
        if self.local is not None:
            self.local.close()
        self.pool.shutdown(wait=True)
        if not self.shared:
            self.decoders.shutdown(wait=True)
        self.planner.shutdown(wait=True)
