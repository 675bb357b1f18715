"""Schemas of a dataset whose shards were written by different tools.

Shards may differ in column order, nullability, the names Parquet writers give list
items (``item``, ``element``, ``array``) and 32- or 64-bit offsets (``string`` and
``large_string``): those are the same column, read in the type the first shard holding it
gives, as `pyarrow.dataset` reads such files. A column that only some shards have, or
whose types differ between shards, is fine as long as nobody asks for it; asking for it
is an error naming a shard on each side, the column and both types. A column of type
``null`` (all values null: what writers infer for an empty or all-None column) takes the
type the other shards give it. View types are read as their offsets types
(loader.columns.views), whichever shard comes first.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ..columns.views import without_views
from ..errors import ShardError
from ..storage.filesystems import redact

__all__ = ["plain_type", "select_schema", "unify_schemas"]


def plain_type(t: pa.DataType) -> pa.DataType:
    """`t` with nested fields' nullability, list item names and 32/64-bit offsets
    normalized, for comparing types the way readers of other writers' files must:
    ``large_list<element: int32 not null>`` (polars) is ``list<item: int32>`` (pyarrow),
    ``large_string`` (pandas 3, polars) is ``string``."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(plain_type(t.value_type), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), plain_type(t.item_type))
    return t


def unify_schemas(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """Every column of any schema, in first-seen order; each with the type the first schema
    holding it gives, nullable if it is nullable anywhere."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for f in schema:
            old = fields.get(f.name)
            if old is None:
                fields[f.name] = f.remove_metadata()
            elif f.nullable and not old.nullable:
                fields[f.name] = old.with_nullable(True)
    return pa.schema(list(fields.values()))


def select_schema(
    schemas: Sequence[pa.Schema], examples: Sequence[str], columns: Sequence[str] | None
) -> pa.Schema:
    """The schema of the asked columns (all columns when None), as every shard must read.

    `examples[i]` is the URL of a shard whose schema is `schemas[i]`. Raises ShardError
    naming the shard, the column and both types when a shard lacks an asked column or
    holds it with another type, or naming the shard and the column when a shard holds
    several columns of that name; ValueError for a column no shard has.
    """
    unified = unify_schemas(schemas)
    names = unified.names if columns is None else list(columns)
    missing = [c for c in names if c not in unified.names]
    if missing:
        where = redact(examples[0]) if examples else "the shards"
        raise ValueError(
            f"columns {missing} are not in the shards (e.g. {where}); available: {unified.names}"
        )
    out = []
    for name in names:
        for i, schema in enumerate(schemas):
            if schema.names.count(name) > 1:
                raise ShardError(
                    f"{redact(examples[i])}: {schema.names.count(name)} columns are named "
                    f"{name!r}: a record holds one value a name; ask for other columns "
                    "(columns=[...]) or rewrite the file with distinct column names"
                )
        first = next(i for i, s in enumerate(schemas) if name in s.names)
        want = schemas[first].field(name).type
        for i, schema in enumerate(schemas):
            if name not in schema.names:
                raise ShardError(
                    f"{redact(examples[i])}: has no column {name!r} ({redact(examples[first])} "
                    f"has it as {want}); "
                    + (
                        "pass columns=[...] with the columns every shard has"
                        if columns is None
                        else "ask only for columns every shard has"
                    )
                )
            got = schema.field(name).type
            if pa.types.is_null(want) and not pa.types.is_null(got):
                first, want = i, got  # an all-null column takes any other shard's type
            if not pa.types.is_null(got) and not plain_type(got).equals(plain_type(want)):
                raise ShardError(
                    f"{redact(examples[i])}: column {name!r} is {got}, but "
                    f"{redact(examples[first])} has it as {want}; all shards must agree on "
                    "the asked columns' types"
                )
        # views are read as their offsets types (loader.columns.views): batches gather
        # with kernels that have none
        out.append(unified.field(name).with_type(without_views(want)))
    return pa.schema(out)
