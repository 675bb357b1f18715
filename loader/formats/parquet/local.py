"""How pyarrow opens a Parquet shard to read on a reading thread (local files, and remote
shards read through the node cache), kept open per thread and decoding into the memory
pool the reading wants.

`ParquetFile` takes no memory pool: its reads allocate from pyarrow's default (mimalloc),
which keeps a group decoded on the reading thread (loader.read.readahead) and freed by the
consumer in the reading thread's heap. `pooled` gives a `ParquetFile` pyarrow's own reader
made with jemalloc's pool instead.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...columns.arrays import read_pool
from ...shard import Shard
from ...storage.ranges import FetchFile
from ...storage.through import current_cache
from .meta import column_ranges

__all__ = ["OPEN_FILES", "OpenFiles", "pooled", "read_pool"]

OPEN_FILES = 16  # local shards a reading thread keeps open (a block's pieces and more)


def pooled(pf: pq.ParquetFile, source: Any) -> pq.ParquetFile:
    """`pf` (of the local file at path `source`, of a buffer `source`, or of a file object
    other than `source`: closing `pf`'s first reader closes its file) reading `source`
    into `read_pool()`.
    `ParquetFile` takes no memory pool, so its reader is replaced by one of pyarrow's own
    readers made with the pool (pyarrow._parquet's, the class `ParquetFile` makes, opened
    as `ParquetFile` opens it, the footer given, but not pre-buffered: on local disk
    reading each column chunk as the decode asks costs less CPU, 2.0 against 2.2 us a
    record, measured); with a pyarrow whose reader does not open so, `pf` as it is."""
    pool = read_pool()
    if pool is None:
        return pf
    try:
        from pyarrow._parquet import ParquetReader

        reader = ParquetReader(memory_pool=pool)
        reader.open(
            source,
            metadata=pf.metadata,
            pre_buffer=False,
            arrow_extensions_enabled=True,
        )
    except (ImportError, TypeError, AttributeError):
        return pf
    pf.reader.close()
    pf.reader = reader
    return pf


class _Files:
    """One thread's open shards (`open`: key -> (file, whether a map), last used last); a
    class of its own, as OpenFiles refers to each thread's weakly and a dict cannot be."""

    __slots__ = ("__weakref__", "open")

    def __init__(self) -> None:
        self.open: OrderedDict[tuple[str, int, str | None, bool], tuple[pq.ParquetFile, bool]]
        self.open = OrderedDict()


class OpenFiles:
    """Shards opened by pyarrow with their cached footers, the last `OPEN_FILES` of each
    thread kept open (a shard's groups are read one after the other: opening the file and
    its reader for each took a fifth of a small group's decoding). A local file replaced
    meanwhile is still caught: the format checks the version after each read. Shards read
    through the node cache are let go when their reading ends (`drop_cached`). Pickled (to
    DataLoader workers) empty."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()  # each thread's files, against `drop_cached`
        self._threads: weakref.WeakSet[_Files] = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._start()

    def get(
        self, fs: Any, shard: Shard, meta: Any, fetch: Callable[[int, int], bytes] | None = None
    ) -> tuple[pq.ParquetFile, bool]:
        """(The shard's file (with footer `meta`), open on this thread; whether it is a map
        of the node cache's blocks): the local file, or with `fetch` (inside
        `loader.storage.through.reading_shard`), a remote shard the node cache holds whole
        as a memory map of its checked blocks (loader.cache.mapped: pyarrow reads it as a
        local file), else as a file whose every read is `fetch` (the ranged read of its
        indexed version, served by the node cache from its checked blocks)."""
        key = (shard.url, shard.bytes, shard.version, fetch is not None)
        mine: _Files | None = getattr(self._local, "d", None)
        if mine is None:
            mine = self._local.d = _Files()
            with self._lock:
                self._threads.add(mine)
        files = mine.open
        with self._lock:
            got = files.get(key)
            if got is not None:
                files.move_to_end(key)
                return got
        got = _open(fs, shard, meta, fetch)
        with self._lock:
            files[key] = got
            old = [files.popitem(last=False)[1][0] for _ in range(len(files) - OPEN_FILES)]
        for pf in old:
            pf.close()
        return got

    def drop_cached(self) -> None:
        """Let go of every thread's shards read through the node cache (maps of its blocks,
        or files over its reads): their reading ended, and a map would keep a block the
        cache evicts later on disk. Not closed: a read still under way keeps what it reads
        (a map goes with the last buffer over it); the next reading opens them again."""
        with self._lock:
            for mine in list(self._threads):
                for key in [k for k in mine.open if k[3]]:
                    del mine.open[key]

    def read(
        self,
        fs: Any,
        shard: Shard,
        meta: Any,
        fetch: Callable[[int, int], bytes] | None,
        groups: list[int],
        cols: list[str] | None,
    ) -> pa.Table:
        """Row groups `groups` (columns `cols`) of the shard's file (`get`), as pyarrow
        reads them; read from a map of the node cache's blocks, their bytes are counted
        and told to the cache there (its reads do it otherwise)."""
        pf, mapped = self.get(fs, shard, meta, fetch)
        table = pf.read_row_groups(groups, columns=cols, use_threads=False)
        at = current_cache() if mapped else None
        if at is not None:
            starts, ends = column_ranges(shard.url, meta, groups, cols)
            at[0].served(at[1], sum(ends) - sum(starts))
        return table


def _open(
    fs: Any, shard: Shard, meta: Any, fetch: Callable[[int, int], bytes] | None
) -> tuple[pq.ParquetFile, bool]:
    if fetch is None:
        path = fs._strip_protocol(shard.url)
        return pooled(pq.ParquetFile(path, metadata=meta), path), False
    at = current_cache()
    if at is not None:  # the bytes before the footer (given: pyarrow does not read it)
        end = shard.bytes - int(shard.details.get("footer_bytes", 0))
        whole = at[0].mapped(shard.url, (shard.bytes, shard.version), end)
        if whole is not None:
            return pooled(pq.ParquetFile(pa.BufferReader(whole), metadata=meta), whole), True

    def source() -> FetchFile:
        return FetchFile(shard.url, shard.bytes, fetch)

    return pooled(pq.ParquetFile(source(), metadata=meta), source()), False  # a file each
