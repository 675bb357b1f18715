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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq

from ..columns.arrays import read_pool
from ..shard import Shard
from ..storage.ranges import FetchFile

__all__ = ["OPEN_FILES", "OpenFiles", "pooled", "read_pool"]

OPEN_FILES = 16  # local shards a reading thread keeps open (a block's pieces and more)


def pooled(pf: pq.ParquetFile, source: Any) -> pq.ParquetFile:
    """`pf` (of the local file at path `source`, or of a file object other than `source`:
    closing `pf`'s first reader closes its file) reading `source` into `read_pool()`.
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


class OpenFiles:
    """Shards opened by pyarrow with their cached footers, the last `OPEN_FILES` of each
    thread kept open (a shard's groups are read one after the other: opening the file and
    its reader for each took a fifth of a small group's decoding). A local file replaced
    meanwhile is still caught: the format checks the version after each read. Pickled (to
    DataLoader workers) empty."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._local = threading.local()

    def get(
        self, fs: Any, shard: Shard, meta: Any, fetch: Callable[[int, int], bytes] | None = None
    ) -> pq.ParquetFile:
        """The shard's file (with footer `meta`), open on this thread: the local file, or
        with `fetch`, a remote shard as a file whose every read is `fetch` (the ranged read
        of its indexed version; inside `loader.storage.through.reading_shard`, served by
        the node cache from its checked blocks)."""
        key = (shard.url, shard.bytes, shard.version, fetch is not None)
        files: OrderedDict[tuple[str, int, str | None, bool], pq.ParquetFile] | None = getattr(
            self._local, "d", None
        )
        if files is None:
            files = self._local.d = OrderedDict()
        pf = files.get(key)
        if pf is None:
            pf = _open(fs, shard, meta, fetch)
            files[key] = pf
            while len(files) > OPEN_FILES:
                files.popitem(last=False)[1].close()
        files.move_to_end(key)
        return pf


def _open(
    fs: Any, shard: Shard, meta: Any, fetch: Callable[[int, int], bytes] | None
) -> pq.ParquetFile:
    if fetch is None:
        path = fs._strip_protocol(shard.url)
        return pooled(pq.ParquetFile(path, metadata=meta), path)

    def source() -> FetchFile:
        return FetchFile(shard.url, shard.bytes, fetch)

    return pooled(pq.ParquetFile(source(), metadata=meta), source())  # a file each: see pooled
