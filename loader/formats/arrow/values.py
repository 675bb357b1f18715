"""Arrow IPC columns as their values: the encodings an IPC file may hold that the rest of
the loader does not take (dictionaries, run-end encoding, views) turned into the plain
types they encode, as ``to_pylist`` sees them.

`read_type` is the type the index records for a column and a read yields; `plain_column`
turns a decoded column into it. Not ``Array.cast`` for views: pyarrow 26 casts a
``list_view`` whose offsets are not increasing to wrong lists (``[[1], [2, 3], []]`` as
``[[1], [], []]``), so list views are rebuilt from their flattened values and lengths.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ...columns.views import list_of_view, unview, without_views

__all__ = ["check_column", "plain_column", "read_type", "schema_read_types"]


def read_type(t: pa.DataType) -> pa.DataType:
    """The type a column of type `t` is read as: dictionaries as their values, run-end
    encoded as their values, views as the offsets types (``string_view`` as ``string``,
    ``list_view`` as ``list``), inside nested types too."""
    if pa.types.is_dictionary(t):
        return read_type(t.value_type)
    if pa.types.is_run_end_encoded(t):
        return read_type(t.value_type)
    if isinstance(t, pa.BaseExtensionType):  # (json_ and opaque over a view: loader.columns.views)
        return without_views(t)
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(read_type(t.value_type)))
    if pa.types.is_large_list_view(t) or pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(read_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(read_type(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(
            key.with_type(read_type(key.type)), item.with_type(read_type(item.type)), t.keys_sorted
        )
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(read_type(f.type)) for f in t])
    return t


def schema_read_types(schema: pa.Schema) -> pa.Schema:
    """The schema with every field's `read_type`."""
    return pa.schema([f.with_type(read_type(f.type)) for f in schema], schema.metadata)


def plain_column(a: pa.Array) -> pa.Array:
    """The array in its `read_type`, the same values."""
    t = a.type
    target = read_type(t)
    if t.equals(target):
        return a
    if isinstance(t, pa.BaseExtensionType):
        return unview(a)
    if pa.types.is_dictionary(t):  # values made plain first: take has no view kernels
        values = plain_column(a.dictionary)
        return pa.DictionaryArray.from_arrays(a.indices, values).dictionary_decode()
    if pa.types.is_run_end_encoded(t):
        return plain_column(pc.run_end_decode(a))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        # its values in logical order, and offsets from its lengths (not Array.cast: above)
        return list_of_view(a, plain_column(pc.list_flatten(a)), target)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        if pa.types.is_map(t):
            keys, items = plain_column(a.keys), plain_column(a.items)
            return pa.MapArray.from_arrays(a.offsets, keys, items, type=target, mask=_nulls(a))
        kind = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return kind.from_arrays(a.offsets, plain_column(a.values), type=target, mask=_nulls(a))
    if pa.types.is_fixed_size_list(t):
        values = plain_column(a.values.slice(a.offset * t.list_size, len(a) * t.list_size))
        return pa.FixedSizeListArray.from_arrays(values, type=target, mask=_nulls(a))
    if pa.types.is_struct(t):
        children = [plain_column(a.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_nulls(a))
    return a.cast(target)  # string_view, binary_view


def structure_type(t: pa.DataType) -> pa.DataType:
    """`t` with the types whose full validation checks values rather than structure
    (decimals within their precision, date64 a whole number of days, times within a day)
    as types of the same layout that it does not: pyarrow's readers read such values, and
    so do we."""
    if pa.types.is_decimal(t):
        return pa.binary(t.byte_width)
    if pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, structure_type(t.value_type), t.ordered)
    if pa.types.is_run_end_encoded(t):
        return pa.run_end_encoded(t.run_end_type, structure_type(t.value_type))
    for test, make in _LISTS:
        if test(t):
            return make(t.value_field.with_type(structure_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(structure_type(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(
            key.with_type(structure_type(key.type)),
            item.with_type(structure_type(item.type)),
            t.keys_sorted,
        )
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(structure_type(f.type)) for f in t])
    return t


_LISTS = [
    (pa.types.is_list, pa.list_),
    (pa.types.is_large_list, pa.large_list),
    (pa.types.is_list_view, pa.list_view),
    (pa.types.is_large_list_view, pa.large_list_view),
]


def check_column(column: pa.Array) -> None:
    """Full validation of an untrusted column's structure (buffer sizes, offsets within
    bounds and increasing, UTF-8, dictionary indices within their dictionary), before
    anything reads its values; raises pyarrow's ArrowInvalid when it fails."""
    t = structure_type(column.type)
    (column if t.equals(column.type) else column.view(t)).validate(full=True)


def _nulls(a: pa.Array) -> pa.Array | None:
    return a.is_null() if a.null_count else None
