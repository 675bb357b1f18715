"""What each column of a batch is, decided once per dataset from its schema.

A column of a batch is a tensor or a list, and that never changes between batches of one
dataset: a null or a row of another length cannot turn a tensor column into a list.

    numbers (int, float, bool)        tensor (n,); unsigned widened so torch computes with
                                      them (uint8/16 -> int32, uint32/64 -> int64)
    fixed_size_list of numbers        tensor (n, k) (nested: (n, k, m, ...))
    fixed_shape_tensor                tensor (n, *shape)
    list / large_list of numbers      tensor (n, L): every row of the dataset must have the
                                      one length L (the first read tells it), else an error
                                      naming column, shard and lengths; or, with `pad`, rows
                                      padded to the batch's longest with the pad value, and
                                      their lengths beside them as ``<column>__len`` (n,)
    anything else (strings, ...)      list

Nulls in a tensor column: NaN for floats; for integers and booleans an error naming the
column and the shard, unless `fill_nulls` gives the column a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardError
from ..storage.filesystems import redact
from .arrow_numpy import numpy_of
from .views import holds_view

__all__ = ["LENGTHS", "Kind", "check_part", "kind_of", "kinds_of", "tensor_view"]

LENGTHS = "__len"  # a padded column's row lengths come as "<column>__len"

_WIDER = {
    pa.uint8(): pa.int32(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.int64(),
}


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


@dataclass(frozen=True)
class Kind:
    """How one column becomes part of a batch. `shape`: the row shape of a tensor column
    (None for a plain list column, whose length the data tells); `value`: the type of its
    numbers (after widening)."""

    tensor: bool
    value: pa.DataType | None = None
    shape: tuple[int, ...] | None = ()
    levels: int = 0  # list levels above the numbers in Arrow (a fixed_shape_tensor has 1)
    fill: Any = None  # replaces nulls (None: NaN for floats, an error otherwise)
    pad: Any = None  # plain list columns: pad rows to the batch's longest (None: refuse)
    # a list column pyarrow cannot gather rows of (a view inside an extension type the
    # reader cannot make plain: loader.columns.views): refused by name when read
    gathers: bool = True
    # batch_format other than torch: kept as Arrow, numbers (and number lists of one
    # length) taken as numpy where a group allows, and made Arrow again (batch_format)
    arrow: bool = False

    @property
    def ragged(self) -> bool:
        return self.tensor and self.shape is None


def _fixed_shape(t: pa.DataType) -> tuple[tuple[int, ...], int, pa.DataType] | None:
    """(row shape, list levels, number type) of nested fixed-size lists of numbers or of a
    fixed_shape_tensor (one level: its storage is a flat fixed-size list)."""
    if isinstance(t, pa.FixedShapeTensorType):
        perm = t.permutation
        if (perm is not None and list(perm) != sorted(perm)) or not _numeric(t.value_type):
            return None  # a permuted layout is not a plain row-major view
        return tuple(t.shape), 1, t.value_type
    if pa.types.is_fixed_size_list(t):
        if _numeric(t.value_type):
            return (t.list_size,), 1, t.value_type
        inner = _fixed_shape(t.value_type)
        if inner is None or isinstance(t.value_type, pa.FixedShapeTensorType):
            return None
        return (t.list_size, *inner[0]), inner[1] + 1, inner[2]
    return None


def kind_of(field: pa.Field, fill: Any = None, pad: Any = None) -> Kind:
    """The kind of a column of this schema field."""
    t = field.type
    if _numeric(t):
        return Kind(True, _WIDER.get(t, t), (), 0, fill)
    fixed = _fixed_shape(t)
    if fixed is not None:
        shape, levels, value = fixed
        return Kind(True, _WIDER.get(value, value), shape, levels, fill)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _numeric(t.value_type):
        return Kind(True, _WIDER.get(t.value_type, t.value_type), None, 1, fill, pad)
    return Kind(False, gathers=not holds_view(t))


def kinds_of(
    schema: pa.Schema,
    fill_nulls: Mapping[str, Any] | None = None,
    pad: Mapping[str, Any] | None = None,
) -> dict[str, Kind]:
    """Each column's kind; ValueError for options naming unknown or unsuited columns."""
    fill_nulls, pad = dict(fill_nulls or {}), dict(pad or {})
    for option, names in (("fill_nulls", fill_nulls), ("pad", pad)):
        unknown = [n for n in names if n not in schema.names]
        if unknown:
            raise ValueError(f"{option} names columns {unknown} that are not read: {schema.names}")
    kinds = {f.name: kind_of(f, fill_nulls.get(f.name), pad.get(f.name)) for f in schema}
    not_ragged = [n for n in pad if not kinds[n].ragged]
    if not_ragged:
        raise ValueError(f"pad applies to list columns of numbers (list<...>), not to {not_ragged}")
    taken = [n + LENGTHS for n in pad if n + LENGTHS in schema.names]
    if taken:
        raise ValueError(
            f"pad gives each padded column its row lengths as '<column>{LENGTHS}', but the "
            f"data has columns named {taken}: rename them, or leave them out with columns=[...]"
        )
    return kinds


def tensor_view(arr: pa.Array, shape: tuple[int, ...], levels: int) -> np.ndarray:
    """(n, *shape) numpy view of a null-free array of numbers under `levels` levels of
    lists, every row `shape` (booleans, bit-packed in Arrow, are unpacked)."""
    values = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    for _ in range(levels):
        values = _flat(values)
    return numpy_of(values).reshape(len(arr), *shape)


def _flat(arr: pa.Array) -> pa.Array:
    """The values of a list array's rows, offsets and slicing respected: `flatten` (a
    compute call, ~15 us) but for null-free lists, whose rows frame one run of values."""
    if arr.null_count:
        return arr.flatten()
    if isinstance(arr, pa.FixedSizeListArray):
        size = arr.type.list_size
        return arr.values.slice(arr.offset * size, len(arr) * size)
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)) and len(arr):
        first, last = arr.offsets[0].as_py(), arr.offsets[-1].as_py()
        return arr.values.slice(first, last - first)
    return arr.flatten()


def check_part(table: pa.Table, kinds: Mapping[str, Kind], url: str) -> pa.Table:
    """One shard's rows, made to fit their columns' kinds: nulls filled (NaN for floats,
    `fill`), unsigned numbers widened. Raises ShardError naming the column, the shard and
    the values that do not fit. Plain list lengths are not checked here: a reader checks
    them in reading order (`check_length`), once per group."""
    for i, name in enumerate(table.column_names):
        kind = kinds.get(name)
        if kind is None or not kind.tensor:
            if kind is not None and not kind.gathers:
                raise ShardError(
                    f"{redact(url)}: column {name!r} is {table.field(i).type}, a view type "
                    "that pyarrow cannot gather into batches; read it as records (no "
                    "batch_size), or leave it out (columns=[...])"
                )
            continue
        col = table.column(i)
        fixed = _fix(col, kind, name, url)
        if fixed is not col:
            table = table.set_column(i, table.field(i).with_type(fixed.type), fixed)
    return table


def _fix(col: pa.ChunkedArray, kind: Kind, name: str, url: str) -> pa.ChunkedArray:
    if isinstance(col.type, pa.BaseExtensionType):
        col = pa.chunked_array([c.storage for c in col.chunks], type=col.type.storage_type)
    if kind.levels and col.null_count:
        if not (kind.ragged and kind.pad is not None):
            raise ShardError(
                f"{redact(url)}: column {name!r} has {col.null_count} null row(s), which a "
                "tensor column cannot hold"
                + (
                    f"; pass pad={{{name!r}: <value>}} to read them as empty rows, padded"
                    if kind.ragged
                    else ""
                )
            )
        col = pc.fill_null(col, pa.scalar([], type=col.type))
    # the numbers, a chunk's sliced out of its lists (pc.list_flatten: 25 us a group)
    chunks, value_type = col.chunks, col.type
    for _ in range(kind.levels):
        chunks, value_type = [_flat(c) for c in chunks], value_type.value_type
    if value_type == kind.value and not any(c.null_count for c in chunks):
        return col
    values = pa.chunked_array(chunks, value_type)
    if values.null_count:
        values = _fill(values, kind, name, url)
    try:
        values = values.cast(kind.value)
    except pa.ArrowInvalid as e:
        raise ShardError(
            f"{redact(url)}: column {name!r} ({values.type}) does not fit {kind.value}: {e}"
        ) from e
    return _rebuild(col, values, kind)


def _fill(values: pa.ChunkedArray, kind: Kind, name: str, url: str) -> pa.ChunkedArray:
    if kind.fill is not None:
        return pc.fill_null(values, pa.scalar(kind.fill).cast(values.type))
    if pa.types.is_floating(values.type):
        return pc.fill_null(values, pa.scalar(float("nan"), type=values.type))
    tensor = "a boolean tensor" if pa.types.is_boolean(kind.value) else "an integer tensor"
    raise ShardError(
        f"{redact(url)}: column {name!r} ({values.type}) holds {values.null_count} null(s), "
        f"which {tensor} cannot; pass fill_nulls={{{name!r}: <value>}} to replace them"
    )


def _rebuild(col: pa.ChunkedArray, values: pa.ChunkedArray, kind: Kind) -> pa.ChunkedArray:
    """`col` with its numbers replaced by `values` (same count, same order)."""
    if not kind.levels:
        return values
    flat = values.combine_chunks()
    if kind.ragged:
        arr = col.combine_chunks()  # null-free here: offsets frame exactly the values
        offsets = pc.subtract(arr.offsets, arr.offsets[0])
        return pa.chunked_array([pa.ListArray.from_arrays(offsets, flat)])
    sizes = list(kind.shape or ())
    if kind.levels == 1:
        sizes = [int(np.prod(sizes))]
    for size in reversed(sizes):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return pa.chunked_array([flat])


def check_length(name: str, url: str, lo: int, hi: int, lengths: dict[str, int]) -> None:
    """Rows of a plain list column with lengths lo..hi fit a tensor column only if they all
    have the length the first rows read had (kept in `lengths`); else a ShardError naming
    the column, the shard, the lengths and the fix."""
    first = lengths.setdefault(name, lo)
    if lo != hi or lo != first:
        raise ShardError(
            f"{redact(url)}: column {name!r} has rows of length {lo}..{hi}, but a tensor "
            f"column needs one length (the first rows this process read had {first}); pass "
            f"pad={{{name!r}: <value>}} to pad rows to each batch's longest"
        )
