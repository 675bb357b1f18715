"""Each document's token count, kept in the index as Megatron keeps its document sizes.

Packing must know how many blocks every rank makes before reading (`len`, equal counts),
and where in which document each block starts; both need every document's token count.
Parquet's metadata gives only a column chunk's value count per row group (empty and null
lists counted in), not per row, so the counts are read once: the token column of every
shard (pyarrow decodes it; nothing else is read) gives each row's list length. They are
kept in the index table as the column ``tokens:<column>`` (per shard, a list of int32: one
count a document in storage order), so ``ds.index.save(...)`` keeps them and a job
started from the saved index reads no token to count them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardError, StaleIndexError
from ..formats import Format
from ..index.distributed import per_shard
from ..index.shard_index import ShardIndex
from ..storage.filesystems import filesystem, redact

__all__ = ["COUNT_THREADS", "document_lengths", "lengths_column"]

log = logging.getLogger("shardstream.loader.tokens")
COUNT_THREADS = 16


def lengths_column(column: str) -> str:
    """The index table's column holding the token counts of `column`."""
    return f"tokens:{column}"


def document_lengths(
    index: ShardIndex,
    fmt: Format,
    column: str,
    storage_options: dict[str, Any] | None = None,
) -> npt.NDArray[np.int64]:
    """(N,) tokens of each document (row of `column`) by global record id: from the
    index when it holds them, else read from the shards once and added to the index (the
    cost: every shard's token column, read in COUNT_THREADS threads, under a process group
    each rank a 1/R share; logged at INFO with the advice to save the index). A shard
    whose row count differs from the index's is a StaleIndexError naming it."""
    name = lengths_column(column)
    if name in index.table.column_names:
        kept = index.table.column(name)
        values = pc.list_flatten(kept.combine_chunks() if kept.num_chunks != 1 else kept.chunk(0))
        counts: npt.NDArray[np.int64] = values.to_numpy(zero_copy_only=False).astype(np.int64)
        if counts.size != index.num_records:
            raise StaleIndexError(
                f"the index's {name!r} holds {counts.size} document lengths for "
                f"{index.num_records} records: rebuild the index"
            )
        return counts
    began = time.perf_counter()
    shards = list(range(len(index)))
    if not shards:
        return np.zeros(0, dtype=np.int64)
    fs, _ = filesystem(index.shards[0].url, storage_options)

    def count(s: int) -> npt.NDArray[np.int32]:
        shard = index.shards[s]
        if shard.num_records == 0:
            return np.zeros(0, dtype=np.int32)
        table = fmt.read(fs, shard, 0, shard.num_records, [column])
        if table.num_rows != shard.num_records:
            raise StaleIndexError(
                f"{redact(shard.url)}: {table.num_rows} rows read, the index has "
                f"{shard.num_records}: rebuild the index"
            )
        col = table.column(column)
        lengths = pc.fill_null(pc.list_value_length(col), 0)
        return np.asarray(lengths.to_numpy(), dtype=np.int32)

    parts = per_shard(count, shards, "the token counts", COUNT_THREADS)
    counts = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if counts.size and int(counts.max()) >= 2**31:
        raise ShardError(f"a document of {int(counts.max())} tokens in {column!r}: too long")
    offsets = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
    kept_column = pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(counts.astype(np.int32), pa.int32())
    )
    index.table = index.table.append_column(name, kept_column)
    log.info(
        "counted the tokens of %d documents of %d shards (%d tokens) in %.2f s, reading "
        "their %r column; ds.index.save('<path>.index.arrow') keeps the counts, so a job "
        "started from that saved index reads none",
        counts.size,
        len(shards),
        int(counts.sum()),
        time.perf_counter() - began,
        column,
    )
    return counts
