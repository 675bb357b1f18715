"""Arrow tables to batches of tensors, from Arrow's buffers without per-record Python work."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["column_to_batch", "numpy_view", "regroup"]


def _is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def numpy_view(arr: pa.Array) -> np.ndarray | None:
    """One Arrow array as numpy: (n,) for numbers, (n, k) for lists of k numbers each;
    a view of Arrow's buffers (booleans, bit-packed there, are unpacked). None when the
    array has nulls, ragged lists or another type."""
    t = arr.type
    if arr.null_count:
        return None
    if _is_numeric(t):
        return np.asarray(arr.to_numpy(zero_copy_only=not pa.types.is_boolean(t)))
    listy = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if listy and _is_numeric(t.value_type) and len(arr):
        lo, hi = pc.min_max(pc.list_value_length(arr)).values()
        values = arr.flatten()  # respects offsets and slicing
        if lo.as_py() == hi.as_py() and not values.null_count:
            flat = numpy_view(values)
            return None if flat is None else flat.reshape(len(arr), int(hi.as_py()))
    return None


def _tensor(values: np.ndarray) -> torch.Tensor:
    # Arrow's buffers are read-only, and torch warns on read-only arrays. The buffers belong
    # to a table this loader made (take/concat allocate new ones) and nobody else holds, so
    # sharing them is safe and saves a copy.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(values)


def column_to_batch(col: pa.ChunkedArray | pa.Array) -> torch.Tensor | list[Any]:
    """Numeric columns without nulls -> 1-D tensor; list columns whose rows are all numeric,
    null-free and of one length -> 2-D tensor; anything else -> a Python list."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    view = numpy_view(arr)
    return _tensor(view) if view is not None else arr.to_pylist()


def _rows(columns: dict[str, Any]) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def _concat(parts: list[Any]) -> Any:
    """Column parts end to end: one tensor where they agree in dtype and row shape."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, torch.Tensor) for p in parts):
        first = parts[0]
        if all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
            return torch.cat(parts)
    return [x for p in parts for x in (p.tolist() if isinstance(p, torch.Tensor) else p)]


def regroup(columns: Iterator[dict[str, Any]], size: int) -> Iterator[dict[str, Any]]:
    """Batches of exactly `size` rows (the last may be short) from chunks of columns.

    Each chunk is converted once (tensors from Arrow's buffers); a batch inside one chunk
    is a slice of it, a view without copies; one across chunks is concatenated.
    """
    pending: list[dict[str, Any]] = []
    have = 0
    for chunk in columns:
        n, lo = _rows(chunk), 0
        while n - lo >= size - have:
            take = size - have
            part = {k: v[lo : lo + take] for k, v in chunk.items()}
            if pending:
                parts = [*pending, part]
                yield {k: _concat([p[k] for p in parts]) for k in chunk}
                pending, have = [], 0
            else:
                yield part
            lo += take
        if lo < n:
            pending.append({k: v[lo:] for k, v in chunk.items()})
            have += n - lo
    if pending:
        keys = pending[0].keys()
        yield {k: _concat([p[k] for p in pending]) for k in keys}
