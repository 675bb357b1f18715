"""Arrow columns as numpy arrays without copies, and without `to_numpy` (pyarrow imports
pandas for it on first use, 0.3 s): what the columnar index (loader.index.table) and the tar
member tables (loader.formats.tar.members) read their columns with; and the memory pool
Arrow work on the reading and scanning threads allocates from."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

__all__ = ["flags", "numbers", "one_array", "read_pool"]


def one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array: its chunk when it has one (`combine_chunks` would copy it)."""
    if isinstance(col, pa.Array):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32, pa.uint8(): np.uint8}


def numbers(col: pa.Array | pa.ChunkedArray, fill: int = 0) -> np.ndarray:
    """An integer Arrow column as a numpy array (a view of its buffer when it has no
    nulls; nulls as `fill`). Not `to_numpy`: pyarrow imports pandas for it, 0.3 s."""
    arr = one_array(col)
    if arr.type not in _NUMPY:
        arr = arr.cast(pa.int64())
    kind = np.dtype(_NUMPY[arr.type])
    n = len(arr)
    validity, data = arr.buffers()[:2]
    if data is None:
        return np.full(n, fill, dtype=kind) if arr.null_count else np.zeros(n, dtype=kind)
    values = np.frombuffer(data, dtype=kind, count=n, offset=arr.offset * kind.itemsize)
    if arr.null_count:  # (not `fill_null`: its Python fill value looks pandas up too)
        bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
        values = np.where(bits[arr.offset : arr.offset + n].astype(bool), values, fill)
        values = values.astype(kind, copy=False)
    return values


def flags(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as a numpy bool array, nulls False."""
    return numbers(one_array(mask).cast(pa.uint8())).astype(bool)


@functools.cache
def read_pool() -> pa.MemoryPool | None:
    """The pool local reads decode into, and tar scans build their names in: jemalloc's
    where pyarrow has it (Linux, macOS). With pyarrow's default, mimalloc, each thread
    keeps its own heap: groups decoded on the reading thread and freed by the consumer
    stay in the reading thread's heap (measured: scripts.bench's second pass +146 MB of peak
    RSS with mimalloc, +94 with these reads in jemalloc, at less CPU); 16 threads
    scanning 16 tar shards peaked at +380 MB with their names built in mimalloc, +300 in
    jemalloc."""
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowNotImplementedError):
        return None
