"""The read pipeline: records [start, stop) of reading plans, fetched and decoded ahead.

A `PlanReader` knows one dataset (its index, format, columns, storage and retry policy) and
turns runs of a plan into *parts*: what the format's `cut` gives for consecutive records
(an Arrow-backed column dict, a list of samples), cut so that every `step` records from
the start of a read end a part (a batch is then one part, or a few joined by `regroup`).

    (plan, start, stop) runs -> read groups (a piece's decode units), in the order the
                                reading first needs them: fetched by `read_threads`
                                threads as far ahead as the memory budget allows (off
                                local disk), decoded a few ahead by decoding threads, or
                                by the consumer when it needs them (loader.read.decoding:
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

The memory budget is loader.read.budget; who decodes a group, and when, loader.read.decoding.

For a mixture of streams, give each stream's reader one shared MemoryBudget (so the bound
holds for all of them together); each reader still reads its own stream's groups in its
own order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from shardstream.sampler.plan import Chunk, Plan

from ..cache.node import NodeCache
from ..columns.gather import ConversionError
from ..errors import ShardError, redact
from ..formats import Format
from ..index.shard_index import ShardIndex
from ..stats import Stats, active, fetch_seconds
from ..storage.filesystems import filesystem
from ..storage.ranged_get import S3_CONCURRENCY
from ..storage.retry import RetryPolicy
from ..storage.through import reading_shard
from .budget import DEFAULT_MEMORY_BUDGET, MemoryBudget, budget_of
from .decoding import decode_threads, decoding_pool
from .groups import Group, Stopped, finish
from .reading import Reading, Run

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "OPENED",
    "RECORD_SLAB",
    "RECORD_SLAB_BYTES",
    "SLAB",
    "MemoryBudget",
    "PlanReader",
    "Run",
    "decode_threads",
    "decoding_pool",
    "is_local",
]


OPENED = object()  # `parts(opened=True)` yields this first: its first groups are started
SLAB = 2048  # records gathered at once from the groups held (then cut into parts)
# ... in record mode, where a slab's columns are small (pointers to Python objects, and
# numbers) and its fixed cost weighs more: measured on perfcheck's set, one process
# alternating 2,048 and 8,192 over 50 passes, twice: main thread 0.89-0.90 -> 0.83-0.86 us
# a record, process 1.18-1.23 -> 1.10-1.12, wall -3 to -10%; batch mode unchanged (a slab
# of 8,192 there held 4 times the memory for no gain; tar samples, whose slab holds
# their bytes, read ~9% slower from S3 in the bench, both pairs)
RECORD_SLAB = 8192
# ... while its gathered columns hold at most this much (else SLAB): records with a list of
# 128 int32 (528 bytes a record gathered) read 3-10% slower in slabs of 8,192 (4 MB, out
# of the cache before each record is made) in 3 of 4 alternating pairs of the bench
RECORD_SLAB_BYTES = 1 << 20
CHUNK_RECORDS = 32768  # records of the reading order computed at once (small: the first
# records flow sooner, and the consumer thread does not hold the GIL long)
FIRST_CHUNK = 4096  # ... but for a run's first chunk: the first batch waits for its order
# (measured: the first 32,768 records' order took 17-22 ms of a 55-78 ms first batch)
# decoded bytes per estimated byte until a group is measured: encoded pages are often
# smaller than the decoded columns (dictionaries, run lengths), so start cautious
FIRST_SCALE = 2.0


def is_local(index: ShardIndex, storage_options: dict[str, Any] | None) -> bool:
    """Whether the index's shards are local files."""
    if not index.shards:
        return True
    fs, _ = filesystem(index.shards[0].url, dict(storage_options or {}))
    return isinstance(fs, LocalFileSystem)


def _selected(taken: Any, lo: int, hi: int) -> Any:
    """Rows [lo, hi) of a Selection (`PlanReader.parts` with `select`)."""
    return taken.slice(lo, hi - lo)


def _gathered_bytes(taken: Any) -> int:
    """Bytes of a gathered slab's columns (numpy or Arrow; Python objects as pointers)."""
    if not isinstance(taken, dict):
        return 0
    return sum(int(getattr(c, "nbytes", 0)) for c in taken.values())


def _chunks(plan: Plan, a: int, b: int) -> Iterator[Chunk]:
    """Records [a, b) of the plan in reading order: a first chunk of FIRST_CHUNK records,
    then chunks of CHUNK_RECORDS (the chunking never changes the order)."""
    first = min(b, a + FIRST_CHUNK)
    yield from plan.chunks(a, first, FIRST_CHUNK)
    if first < b:
        yield from plan.chunks(first, b, CHUNK_RECORDS)


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
    by default each `parts` call starts its own; `readers`, likewise, the thread reading
    local Parquet groups ahead (loader.read.readahead.reading_pool). `cache`: the node
    cache remote reads go through (loader.cache.node), if any.
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
        cache: NodeCache | None = None,
        readers: ThreadPoolExecutor | None = None,
    ) -> None:
        self.index = index
        self.cache = cache
        self.fmt = fmt
        self.columns = None if columns is None else list(columns)
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.read_threads = read_threads
        self.prefetch = prefetch
        self.budget = budget_of(memory_budget)
        self.stats = stats if stats is not None else Stats()
        self.decoders, self.readers = decoders, readers
        self._lock = threading.Lock()
        self._measured = [0, 0]  # bytes decoded groups held, and what was estimated for them

    def parts(
        self,
        runs: Iterable[Run],
        step: int,
        select: bool = False,
        opened: bool = False,
        first: int = 0,
        slab: int = SLAB,
    ) -> Iterator[Any]:
        """The runs' records in reading order, in parts of at most `step` records that end
        at multiples of `step` records from the start (so batches are single parts); with
        `first` (0 < first < step), the first part holds `first` records and the later ones
        end at multiples of `step` from its end (a mixture's first batch needs a few of each
        stream's records, not a step of each: the groups of the first part are those the
        opening sends). `select` (Parquet and Arrow shards): the parts are Selections
        (loader.columns.gather), their rows copied later (a mixture gathers its streams'
        parts at once). `opened`: first yields OPENED once the first groups are started,
        before waiting on any (a mixture starts every stream's so). `slab`: records
        gathered at once (rounded down to whole steps, at least one): SLAB, or RECORD_SLAB
        where the parts become records; one above SLAB becomes SLAB after the first slab
        if that slab's columns, at this size, would hold more than RECORD_SLAB_BYTES."""
        runs = list(runs)
        if not runs or not self.index.shards:
            return
        fs, _ = filesystem(self.index.shards[0].url, self._options())
        slab = step * max(1, slab // step)
        sized = slab <= SLAB  # (else checked against RECORD_SLAB_BYTES at the first slab)
        cut = _selected if select else self.fmt.cut
        reading = Reading(self, fs, runs)
        self.fmt.reserve(reading.budget.limit + reading.budget.limit // 2)
        done = step - first if 0 < first < step else 0  # (the first part ends where a step would)
        try:
            reading.pump()
            if opened:
                yield OPENED
            for r, (plan, a, b) in enumerate(runs):
                block: tuple[int, int] | None = None
                for chunk in reading.ahead_of(_chunks(plan, a, b)):
                    if chunk.block != block:
                        if block is not None:
                            reading.let_go_block(r, block)
                        block = chunk.block
                    lo = 0
                    while lo < len(chunk):
                        hi = min(len(chunk), lo + slab - done % slab)
                        hi, groups = reading.slab_end(r, chunk, lo, hi, step - done % step, step)
                        taken = reading.gather(r, chunk, lo, hi, groups, select)
                        if not sized:
                            sized = True
                            if _gathered_bytes(taken) * slab > RECORD_SLAB_BYTES * (hi - lo):
                                slab = step * max(1, SLAB // step)
                        at = 0
                        while at < hi - lo:
                            end = min(hi - lo, at + step - done % step)
                            yield cut(taken, at, end)
                            done += end - at
                            at = end
                        lo = hi
                if block is not None:
                    reading.let_go_block(r, block)
        finally:
            reading.close()

    @property
    def local(self) -> bool:
        """Whether the shards are local files (no fetching ahead pays: see `Reading`)."""
        return is_local(self.index, self.storage_options)

    def _options(self) -> dict[str, Any]:
        """The storage options, with room for `read_threads` S3 connections where that is
        more than the pool loader.storage.s3.s3_defaults gives (S3_CONCURRENCY) and the
        caller chose no pool size. Otherwise the options as given: the filesystem the
        index was loaded with is the one that reads (loader.storage.filesystems._shared),
        not a second client built before the first read."""
        config = dict(self.storage_options.get("config_kwargs") or {})
        url = self.index.shards[0].url
        if not url.startswith(("s3://", "s3a://")) or self.read_threads <= S3_CONCURRENCY:
            return self.storage_options
        config.setdefault("max_pool_connections", self.read_threads)
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

    def fetch(self, fs: Any, entry: Group) -> None:
        """Fetch a group's bytes (in a fetching thread), then queue it for decoding (see
        `loader.read.decoding.Ahead`); its future gets the joined block, or None if it was
        let go first.
        Off local disk, the later groups of the same shard already started are fetched
        with it (up to FETCH_BYTES stored): fewer, larger requests, as object stores want."""
        together = entry.ahead.claim(entry)
        if not together:
            return  # an earlier fetch of its shard took it along
        if entry.ahead.halted:  # a read failed, or reading stopped: start nothing more
            for e_ in together:
                finish(e_, None, Stopped("an earlier read failed, or reading stopped"))
            return
        try:
            shard = self.index.shards[entry.shard]
            rows = [(e.first, e.stop) for e in together]
            with active(self.stats), reading_shard(self.cache, entry.shard):
                raws = self.fmt.fetch_many(fs, shard, rows, self.columns)
        except BaseException as e:
            # the reads queued behind this one start nothing: the error reaches the
            # consumer after the reads in flight, not after each queued one has spent its
            # own retries
            entry.ahead.halted = True
            for e_ in together:
                finish(e_, None, e)
            return
        for e_, raw in zip(together, raws):
            entry.ahead.fetched(e_, raw)

    def decode(self, fs: Any, entry: Group, raw: Any, table: Any = None, failed: Any = None) -> Any:
        """Decode and join one group (in a decoding thread: the same few threads decode
        every group, so Arrow's allocator keeps free memory in few thread heaps), and
        charge the budget its measured size instead of the estimate. `table`: its rows,
        read on a reading thread (loader.read.readahead), checked and shaped here;
        `failed`: that read's error instead (the format raises it, named)."""
        with active(self.stats):
            t0 = time.perf_counter()
            fetched = fetch_seconds()  # local files are read while decoding
            try:
                fmt: Any = self.fmt  # a table read ahead: Parquet's decode takes it
                read_ahead = table is not None or failed is not None
                part = fmt.decode(fs, raw, table, failed) if read_ahead else fmt.decode(fs, raw)
                block = self.fmt.join([part])
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
