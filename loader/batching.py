"""Arrow tables to batches of tensors, from Arrow's buffers without per-record Python work."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["regroup", "table_to_batch"]


def _is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


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
    t = arr.type
    if _is_numeric(t) and arr.null_count == 0:
        return _tensor(arr.to_numpy(zero_copy_only=False))
    list_like = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if list_like and arr.null_count == 0 and _is_numeric(t.value_type) and len(arr):
        lengths = pc.list_value_length(arr)
        lo, hi = pc.min_max(lengths).values()
        values = arr.flatten()
        if lo.as_py() == hi.as_py() and values.null_count == 0:
            flat = values.to_numpy(zero_copy_only=False)
            return _tensor(flat.reshape(len(arr), int(hi.as_py())))
    return arr.to_pylist()  # type: ignore[no-any-return]


def table_to_batch(table: pa.Table) -> dict[str, torch.Tensor | list[Any]]:
    """One batch: column name -> tensor (see `column_to_batch`) or list."""
    return {name: column_to_batch(table.column(name)) for name in table.column_names}


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
