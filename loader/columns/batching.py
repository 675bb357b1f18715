"""Arrow tables to batches of tensors, from Arrow's buffers without per-record Python work."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from .arrow_numpy import numpy_of

__all__ = ["Batch", "column_to_batch", "numpy_view", "regroup"]


class Batch(dict[str, Any]):
    """A batch the dataset made (``batch_size=B``): column -> tensor or list, a plain dict
    in every way but its type, which lets torch's collation recognize it (see
    `_refuse_collation`)."""


def _refuse_collation(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    """A DataLoader with its own batch_size (1 by default) collating the dataset's batches
    would stack them into [loader batch, B, ...] without a word: refuse, with the fix."""
    raise TypeError(
        f"DataLoader is batching shardstream batches (it collated {len(batch)} of them, each "
        f"of {_rows(batch[0])} records): the dataset already batches (batch_size=...), so "
        "pass batch_size=None to DataLoader, e.g. DataLoader(ds, batch_size=None, "
        "num_workers=4); or leave batch_size out of the dataset and let DataLoader batch"
    )


# torch's documented extension point ("Extend `default_collate` by in-place modifying
# `default_collate_fn_map`"): only our Batch type is added, nothing else changes.
default_collate_fn_map[Batch] = _refuse_collation


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
        return numpy_of(arr)
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


def _concat(parts: list[Any], pad: Any = None) -> Any:
    """Column parts end to end: tensors into one tensor (rows of 2-D parts padded to the
    longest with `pad`, when given), lists into one list. A tensor column never becomes a
    list: parts that cannot join are a ValueError."""
    if len(parts) == 1:
        return parts[0]
    if not any(isinstance(p, torch.Tensor) for p in parts):
        return [x for p in parts for x in p]
    if not all(isinstance(p, torch.Tensor) for p in parts):
        raise ValueError("a batch column joins tensors and lists; its kind must not change")
    if pad is not None and len({p.shape[1:] for p in parts}) > 1 and parts[0].dim() == 2:
        width = max(p.shape[1] for p in parts)
        parts = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in parts]
    shapes = {p.shape[1:] for p in parts}
    if len(shapes) > 1:
        raise ValueError(f"a batch column joins tensors of row shapes {sorted(shapes)}")
    return torch.cat(parts)


def regroup(
    columns: Iterator[dict[str, Any]], size: int, pads: Mapping[str, Any] | None = None
) -> Iterator[Batch]:
    """Batches of exactly `size` rows (the last may be short) from chunks of columns.

    Each chunk is converted once (tensors from Arrow's buffers); a batch inside one chunk
    is a slice of it, a view without copies; one across chunks is concatenated.
    """
    pads = pads or {}
    pending: list[dict[str, Any]] = []
    have = 0
    for chunk in columns:
        n, lo = _rows(chunk), 0
        while n - lo >= size - have:
            take = size - have
            part = {k: v[lo : lo + take] for k, v in chunk.items()}
            if pending:
                parts = [*pending, part]
                yield Batch({k: _concat([p[k] for p in parts], pads.get(k)) for k in chunk})
                pending, have = [], 0
            else:
                yield Batch(part)
            lo += take
        if lo < n:
            pending.append({k: v[lo:] for k, v in chunk.items()})
            have += n - lo
    if pending:
        keys = pending[0].keys()
        yield Batch({k: _concat([p[k] for p in pending], pads.get(k)) for k in keys})
