"""`batch_format=`: batches as torch tensors (the default), numpy arrays, a
``pyarrow.RecordBatch`` or a pandas ``DataFrame``.

"arrow", "pandas" and "numpy" batches of Parquet and Arrow IPC shards are made from the
rows Arrow gathered (every column kept as Arrow: strings, structs, nulls and ragged lists
as they are, no `pad` or `fill_nulls`); a RecordBatch of exactly the batch's rows, then
pandas' ``to_pandas()`` or each column's ``to_numpy(zero_copy_only=False)`` (numbers
without nulls as views; anything else as pyarrow converts it). Tar samples are
webdataset's dicts: their batch (column -> list, or a tensor of numbers) becomes a
RecordBatch by ``from_pydict``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .kinds import Kind

__all__ = ["BATCH_FORMATS", "arrow_batches", "arrow_kinds", "check_batch_format", "shaped"]

BATCH_FORMATS = ("torch", "numpy", "arrow", "pandas")


def check_batch_format(batch_format: object, batch_size: int | None, pack: object) -> str:
    """`batch_format` checked: one of BATCH_FORMATS; ValueError naming it otherwise, or
    when it is not "torch" without `batch_size` (records are dicts) or with `pack`
    (blocks of token ids are tensors)."""
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format must be one of {BATCH_FORMATS}, got {batch_format!r}")
    if batch_format != "torch" and batch_size is None:
        raise ValueError(
            f"batch_format={batch_format!r} shapes batches: pass batch_size (records come "
            "as dicts, as Arrow's to_pylist gives them)"
        )
    if batch_format != "torch" and pack is not None:
        raise ValueError(
            f"batch_format={batch_format!r} with pack=: packed blocks are tensors of token "
            "ids; leave batch_format out"
        )
    return str(batch_format)


def arrow_kinds(schema: pa.Schema) -> dict[str, Kind]:
    """Kinds that keep every column as Arrow (loader.columns.gather.Block), numbers (and
    lists of numbers of one length) gathered by numpy where a group allows: numpy's take
    of a 2-D block of token lists costs a fraction of Arrow's take of the list array."""
    return {name: Kind(False, arrow=True) for name in schema.names}


def _arrow(values: Any, kind: pa.DataType) -> pa.Array:
    """A gathered column as Arrow of its schema type: Arrow as it is; numpy (n,) numbers
    or (n, k) rows of a list column as that type again (views, but the list offsets)."""
    if not isinstance(values, np.ndarray):
        return values
    if values.ndim == 1:
        return pa.array(values, kind)
    n, k = values.shape[0], int(np.prod(values.shape[1:]))
    flat = pa.array(values.reshape(-1), kind.value_type)
    if pa.types.is_fixed_size_list(kind):
        return pa.FixedSizeListArray.from_arrays(flat, type=kind)
    width = np.int64 if pa.types.is_large_list(kind) else np.int32
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=width))
    make = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
    return make.from_arrays(offsets, flat, type=kind)


def arrow_batches(
    parts: Iterator[Mapping[str, Any]], size: int, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """RecordBatches of exactly `size` rows (the last may be short) of `schema`'s columns
    from gathered parts (column -> Arrow array, or numpy where `arrow_kinds` took it so)."""
    pending: list[pa.RecordBatch] = []
    have = 0
    for part in parts:
        arrays = [_arrow(v, schema.field(k).type) for k, v in part.items()]
        batch = pa.RecordBatch.from_arrays(arrays, names=list(part))
        lo = 0
        while batch.num_rows - lo >= size - have:
            piece = batch.slice(lo, size - have)
            lo += size - have
            yield pa.concat_batches([*pending, piece]) if pending else piece
            pending, have = [], 0
        if lo < batch.num_rows:
            pending.append(batch.slice(lo))
            have += batch.num_rows - lo
    if pending:
        yield pa.concat_batches(pending)


def _listed(values: Any) -> Any:
    """A tar batch's column as pyarrow takes it: a tensor as numpy, rows of a 2-D or
    deeper one as a list of arrays (a list column)."""
    if isinstance(values, torch.Tensor):
        values = values.numpy()
    if isinstance(values, np.ndarray) and values.ndim > 1:
        return list(values)
    return values


def shaped(batch: pa.RecordBatch | Mapping[str, Any], batch_format: str) -> Any:
    """A batch (a RecordBatch, or tar's column -> list) in `batch_format`."""
    if not isinstance(batch, pa.RecordBatch):
        batch = pa.RecordBatch.from_pydict({k: _listed(v) for k, v in batch.items()})
    if batch_format == "arrow":
        return batch
    if batch_format == "pandas":
        return batch.to_pandas()
    out: dict[str, np.ndarray] = {
        name: col.to_numpy(zero_copy_only=False)
        for name, col in zip(batch.schema.names, batch.columns)
    }
    return out
