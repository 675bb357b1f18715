"""Local Parquet read groups read by pyarrow on threads of their own, ahead of the consumer.

A reading of local Parquet shards (loader.read.reading) hands the groups it starts here, in
reading order. Each is read by `ParquetFile.read_row_groups` on one of `THREADS` reading
threads, at most `READAHEAD` groups ahead of the one the consumer waits for. pyarrow holds
no GIL while it reads and decodes, so decoding runs beside the consumer's Python work
instead of inside it: a thread takes the GIL twice a group (to start the read and to hand
back the table), not per record.

The consumer never only waits: a read not started yet is read by the consumer itself,
and while the thread reads the group waited for, the consumer reads the next one not
started (`until`). Measured on 2 cores (docs/benchmarks.md, "The reading thread"): about
the records/s of pyarrow's dataset scanner, which this replaced, at less CPU in batch mode
and mixtures, slower only at rank 0 of 4 in a process that had imported the scanner; the
scanner imported `pyarrow.dataset`, and through it pandas where installed: 0.17 s and
~40 MB of every fresh process, before the first batch.

Shards of a remote source that the node cache holds (loader.cache.node) are read here too
(`cache`): pyarrow reads their column chunks through a file whose reads go through the
cache (checked blocks on local disk; a block it lacks is fetched, on the reading thread),
not the remote path's fetching and decoding threads.

What a thread reads is checked and shaped by the format as its own reads are
(`ParquetFormat.decode` with the table: row counts against the footer, the file's version,
casts, partition columns, kinds). A read that fails on a thread is read again by the format
on the consumer's thread, which raises the error naming the shard and row groups.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import pyarrow as pa

from ..stats import active
from ..storage.through import ByteCache, reading_shard
from .groups import Group, GroupReader, finish

__all__ = ["QUEUED", "READAHEAD", "THREADS", "ReadAhead", "reading_pool", "reads_ahead"]

THREADS = 1  # reading threads of one reading (with the consumer: 2 cores busy)
# groups read or being read ahead of the one the consumer waits for: two blocks' first
# groups (a block interleaves 8 pieces, and its first slab needs a group of each). What
# is held is bounded by the memory budget, which starts the groups, not by this. With 6
# the thread idled while the consumer decoded a quarter of the groups itself (perfcheck's
# set, batch mode, one process alternating: 34 groups a pass against 26, wall -7 to -12%)
READAHEAD = 16
QUEUED = 4  # groups started beyond those, waiting for a read to finish


def reading_pool() -> ThreadPoolExecutor:
    """The reading threads of one reading, or of all a mixture's local streams together
    (`PlanReader(readers=...)`): one thread reading every stream's groups in the order they
    were started, not a thread a stream contending for the one core the consumer leaves
    (3 streams, one process alternating: 1.49 -> 1.38, 1.59 -> 1.49 us a record)."""
    return ThreadPoolExecutor(THREADS, thread_name_prefix="shardstream-read")


def reads_ahead(fmt: Any) -> bool:
    """Whether a format's local shards are read here: Parquet's (Arrow IPC shards, read
    from checked frames, are not)."""
    return getattr(fmt, "name", None) == "parquet"


_Read = tuple[Group, Any, "Future[pa.Table] | None"]  # (group, its fetch, its read)


class ReadAhead:
    """The groups of one reading that threads read: queued in reading order (`add`), read
    `READAHEAD` ahead, decoded in that order as the consumer waits for them (`until`).
    `cache`: the shards are remote, read through this cache. The reading threads are the
    reader's `readers` when it shares them with other readers (its owner shuts them down),
    else this reading's own."""

    def __init__(self, reader: GroupReader, fs: Any, cache: ByteCache | None = None) -> None:
        self.reader, self.fs, self.cache = reader, fs, cache
        self.queue: collections.deque[Group] = collections.deque()  # not submitted yet
        self.reads: collections.deque[_Read] = collections.deque()  # submitted, in order
        self.own = reader.readers is None
        self.pool = reading_pool() if reader.readers is None else reader.readers

    def add(self, entries: list[Group]) -> None:
        """Groups started, in reading order: read as soon as fewer than READAHEAD are."""
        self.queue.extend(entries)
        self._top_up()

    def room(self) -> int:
        """Groups worth starting now: READAHEAD reads plus QUEUED waiting for a slot. A group
        started beyond these waits charged to the memory budget, holding nothing, while
        another reader sharing the budget (a mixture's stream) could not start what its
        consumer needs next (two local streams: 11 of a pass's 80 groups were read by the
        consumer unstarted; now none. One source's peak charge 64 -> 35 MiB, same speed)."""
        return READAHEAD + QUEUED - len(self.reads) - len(self.queue)

    def drop(self, entry: Group) -> None:
        """`entry` is let go: if not submitted yet, its reading ends now (unread); a
        submitted one is discarded when the consumer passes it (`entry.dropped`)."""
        if entry in self.queue:
            self.queue.remove(entry)
            finish(entry, None)

    def until(self, entry: Group) -> None:
        """Decode groups in reading order until `entry`'s reading is over. The consumer
        never only waits: a read the thread has not started is read here, and while the
        thread reads the group waited for, the next read not started is read here
        meanwhile (both cores read the first batch's groups)."""
        while not entry.future.done():
            if not self.reads and not self._submit():
                raise RuntimeError("a group waited for was never started")  # never: `add`
            if not self.reads:
                continue  # its fetch failed: the group ended with that error
            first, got, read = self.reads[0]
            if read is not None and not read.done() and not read.cancel() and self._steal():
                continue
            self.reads.popleft()
            self._top_up()
            table, failed = None, None
            if read is not None and not read.cancelled():
                try:
                    table = read.result()
                except Exception as e:  # raised by the format, which names the shard
                    failed = e
            self._finish(first, got, table, failed)

    def _steal(self) -> bool:
        """Read the first group whose read has not started here, now. False: none. (The
        first, not the last: with 16 reads ahead the last is needed a block later, and the
        first batch waited for the group the thread was left with; first batch 26 -> 21
        ms, one process alternating.)"""
        for k in range(1, len(self.reads)):
            entry, got, read = self.reads[k]
            if read is not None and read.cancel():
                here: Future[pa.Table] = Future()
                try:
                    here.set_result(self._read(entry.shard, got))
                except Exception as e:
                    here.set_exception(e)
                self.reads[k] = (entry, got, here)
                return True
        return False

    def close(self) -> None:
        """Stop: the groups not decoded end unread (their budget is refunded by their
        owner's callbacks); reads under way finish first."""
        if self.own:
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:  # shared threads: this reading's reads not started are cancelled
            wait([r for _, _, r in self.reads if r is not None and not r.cancel()])
        for entry in [e for e, _, _ in self.reads] + list(self.queue):
            if not entry.future.done():
                finish(entry, None)
        self.reads.clear()
        self.queue.clear()
        if self.cache is not None:
            fmt: Any = self.reader.fmt  # Parquet's
            fmt.cached_reading_ended()

    def _top_up(self) -> None:
        while self.queue and len(self.reads) < READAHEAD:
            self._submit()

    def _submit(self) -> bool:
        """Submit the first queued group's read (its row groups found from the index and
        footer first: a failure there ends the group with that error). False: none."""
        if not self.queue:
            return False
        entry = self.queue.popleft()
        try:
            got = self._fetch(entry)
        except Exception as e:
            finish(entry, None, e)
            return True
        read = None if entry.dropped else self.pool.submit(self._read, entry.shard, got)
        self.reads.append((entry, got, read))
        return True

    def _read(self, shard: int, got: Any) -> pa.Table:
        """The rows of a fetched group, as pyarrow reads them, the file's version checked
        (the rest is checked by the format: see `_finish`)."""
        fmt: Any = self.reader.fmt  # Parquet's
        if self.cache is None:
            return fmt.read_checked(self.fs, got)
        with active(self.reader.stats), reading_shard(self.cache, shard):
            return fmt.read_checked(self.fs, got)

    def _fetch(self, entry: Group) -> Any:
        """What a read of `entry` reads (its shard's row groups, from the index and footer)."""
        reader = self.reader
        fmt: Any = reader.fmt
        shard = reader.index.shards[entry.shard]
        with active(reader.stats), reading_shard(self.cache, entry.shard):
            # remote (cached): only the footer; the reading thread reads the chunks
            return fmt.fetch(
                self.fs, shard, entry.first, entry.stop, reader.columns, self.cache is None
            )

    def _finish(
        self, entry: Group, got: Any, table: pa.Table | None, failed: Exception | None = None
    ) -> None:
        """End `entry`'s reading: its block (decoded by the format from `table`, a thread's
        read, or, None, read by the format itself), its error (`failed`: the thread's read
        raised it; the format names it), or nothing if let go."""
        if entry.dropped:
            finish(entry, None)
            return
        block, error = None, None
        try:
            with reading_shard(self.cache, entry.shard):  # (table None: read here)
                block = self.reader.decode(self.fs, entry, got, table, failed)
            if self.cache is not None:  # its rows leave only once the remote agrees
                shard = self.reader.index.shards[entry.shard]
                with active(self.reader.stats):
                    self.cache.confirm(self.fs, shard.url, (shard.bytes, shard.version))
        except BaseException as e:
            error = e
        finish(entry, block, error)
