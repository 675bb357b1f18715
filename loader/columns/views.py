"""Arrow's view types as the offsets types they stand for.

pyarrow reads ``string_view``, ``binary_view``, ``list_view`` and ``large_list_view``
columns from Parquet files whose stored Arrow schema has them (pyarrow writes them so)
and from Arrow IPC files (polars writes its strings as views). pyarrow has no ``take`` (nor
slicing, for some) kernels for views, and batches are gathered with them, so a dataset's
column types hold no view (`without_views`, applied once to the dataset's schema by
loader.formats.schemas.select_schema): a string view column is read as ``string``, a list
view as a ``list``, inside nested types too, with the same values (records as pyarrow's
``to_pylist`` gives them). A decoded Parquet piece holding views differs from the dataset's
schema, which every piece is compared with already (loader.formats.parquet.format), and is made
plain by `unview` there, once a piece (loader.formats.parquet.fetch.cast_to; Arrow IPC
columns by loader.formats.arrow.values): a shard without views pays nothing more.

Not ``Array.cast`` for list views: pyarrow 26 casts a ``list_view`` whose offsets are not
increasing to wrong lists (``[[1], [2, 3], []]`` as ``[[1], [], []]``), so list views are
rebuilt from their flattened values and lengths. Extension types whose storage holds views
(``json_(string_view())``, ``opaque``) keep their extension around the plain storage;
another extension type over views stays as it is, and a batch refuses it by name
(loader.columns.kinds).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["has_view", "holds_view", "list_of_view", "unview", "without_views"]


def without_views(t: pa.DataType) -> pa.DataType:
    """`t` with every view type, at any depth, as its offsets type (``string_view`` as
    ``string``, ``binary_view`` as ``binary``, ``list_view`` as ``list``); dictionaries and
    other encodings stay, around values without views."""
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if isinstance(t, pa.BaseExtensionType):
        return _extension_without_views(t)
    if pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(without_views(t.value_type)))
    if pa.types.is_large_list_view(t) or pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(without_views(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(without_views(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(
            key.with_type(without_views(key.type)),
            item.with_type(without_views(item.type)),
            t.keys_sorted,
        )
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(without_views(f.type)) for f in t])
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, without_views(t.value_type), t.ordered)
    return t


def _extension_without_views(t: pa.BaseExtensionType) -> pa.DataType:
    """pyarrow's extension types that take any string-like storage, over their storage
    without views; any other extension type as it is."""
    storage = without_views(t.storage_type)
    if storage.equals(t.storage_type):
        return t
    json_type = getattr(pa, "JsonType", None)
    if json_type is not None and isinstance(t, json_type):
        return pa.json_(storage)
    opaque_type = getattr(pa, "OpaqueType", None)
    if opaque_type is not None and isinstance(t, opaque_type):
        return pa.opaque(storage, t.type_name, t.vendor_name)
    return t


@functools.lru_cache(maxsize=1024)
def has_view(t: pa.DataType) -> bool:
    """Whether `without_views` changes `t` (a column of it must go through `unview`).
    Cached: asked of each column of every piece whose types differ from the dataset's."""
    return not without_views(t).equals(t)


def holds_view(t: pa.DataType) -> bool:
    """Whether a view type is anywhere in `t`, extension types' storage included (after
    `without_views`, only inside an extension type it cannot rebuild)."""
    if isinstance(t, pa.BaseExtensionType):
        return holds_view(t.storage_type)
    if pa.types.is_dictionary(t):
        return holds_view(t.value_type)
    kinds = (pa.types.is_string_view, pa.types.is_binary_view, pa.types.is_list_view)
    if any(test(t) for test in kinds) or pa.types.is_large_list_view(t):
        return True
    return any(holds_view(t.field(i).type) for i in range(t.num_fields))


def unview(a: pa.Array) -> pa.Array:
    """The array in its type `without_views`, the same values."""
    t = a.type
    target = without_views(t)
    if target.equals(t):
        return a
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return a.cast(target)
    if isinstance(t, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(target, unview(a.storage))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return list_of_view(a, unview(pc.list_flatten(a)), target)
    if pa.types.is_map(t):
        keys, items = unview(a.keys), unview(a.items)
        return pa.MapArray.from_arrays(a.offsets, keys, items, type=target, mask=_nulls(a))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return kind.from_arrays(a.offsets, unview(a.values), type=target, mask=_nulls(a))
    if pa.types.is_fixed_size_list(t):
        values = unview(a.values.slice(a.offset * t.list_size, len(a) * t.list_size))
        return pa.FixedSizeListArray.from_arrays(values, type=target, mask=_nulls(a))
    if pa.types.is_struct(t):
        children = [unview(a.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_nulls(a))
    if pa.types.is_dictionary(t):
        return pa.DictionaryArray.from_arrays(a.indices, unview(a.dictionary), ordered=t.ordered)
    raise TypeError(f"no plain counterpart for {t}")


def list_of_view(a: pa.Array, values: pa.Array, target: pa.DataType) -> pa.Array:
    """A list (or large list) array of type `target` whose rows are those of the list view
    `a`, of which `values` are the flattened values in logical order (`list_flatten`,
    made plain as the caller wants them): offsets from the rows' lengths."""
    # (n,) each row's length, nulls 0; (n + 1,) where each row starts, then the end
    lengths = pc.list_value_length(a).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(a) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = pa.types.is_large_list(target)
    kind: Any = pa.LargeListArray if large else pa.ListArray
    width = pa.int64() if large else pa.int32()
    return kind.from_arrays(pa.array(offsets, width), values, type=target, mask=_nulls(a))


def _nulls(a: pa.Array) -> pa.Array | None:
    return a.is_null() if a.null_count else None
