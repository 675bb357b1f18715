"""Hive partitions: ``key=value`` folders (Spark, polars ``partition_by``, duckdb
``PARTITION_BY``, pandas ``partition_cols``) become columns, as in
``pyarrow.dataset.dataset(..., partitioning="hive")``: values are URI-decoded,
``__HIVE_DEFAULT_PARTITION__`` is null, and a key is int32 when every value of it parses
as an int32, else a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote

import pyarrow as pa

__all__ = [
    "check_hive_values",
    "hive_values",
    "is_hidden",
    "partition_arrays",
    "partition_schema",
]

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
_INT32 = (-(2**31), 2**31 - 1)


def is_hidden(relpath: str) -> bool:
    """Whether a path below the source names no data: a file or folder whose name starts
    with ``_`` or ``.`` (``_SUCCESS``, ``_temporary/``, ``.part-0.parquet.crc``), as
    pyarrow.dataset's ``ignore_prefixes`` says."""
    return any(part.startswith(("_", ".")) for part in relpath.split("/") if part)


def hive_values(path: str) -> dict[str, str | None]:
    """``{key: value}`` of the ``key=value`` folders of a path (the file's own name does
    not count)."""
    out: dict[str, str | None] = {}
    for part in path.split("/")[:-1]:
        key, eq, value = part.partition("=")
        if eq and key:
            decoded = unquote(value)
            out[unquote(key)] = None if decoded == NULL_VALUE else decoded
    return out


def _is_int32(value: str) -> bool:
    text = value[1:] if value.startswith("-") else value
    return text.isascii() and text.isdigit() and _INT32[0] <= int(value) <= _INT32[1]


def partition_schema(values: Sequence[dict[str, str | None]]) -> pa.Schema:
    """The partition fields of a dataset whose shards have these values, keys in
    first-seen order."""
    keys = list(dict.fromkeys(k for v in values for k in v))
    fields = []
    for key in keys:
        seen = [v[key] for v in values if v.get(key) is not None]
        ints = bool(seen) and all(_is_int32(str(x)) for x in seen)
        fields.append(pa.field(key, pa.int32() if ints else pa.string()))
    return pa.schema(fields)


def partition_arrays(
    schema: pa.Schema, values: dict[str, str | None], n: int, names: Sequence[str]
) -> dict[str, pa.Array]:
    """The `names` partition columns of one shard's `n` rows: each one value repeated."""
    out = {}
    for name in names:
        field = schema.field(name)
        raw = values.get(name)
        value = None if raw is None else int(raw) if pa.types.is_integer(field.type) else raw
        out[name] = pa.repeat(pa.scalar(value, type=field.type), n)
    return out


def check_hive_values(table: pa.Table, values: dict[str, str | None], url: str) -> None:
    """ShardError naming the file and the key when a column the file holds disagrees with
    the ``key=value`` folder above it (pyarrow.dataset would give the path's value,
    polars the file's: neither is safe to pick silently)."""
    import pyarrow.compute as pc

    from ..errors import ShardError, redact

    for key, raw in values.items():
        if key not in table.column_names:
            continue
        col = table.column(key)
        if raw is None:
            agree = col.null_count == len(col)
        else:
            try:
                want = pa.scalar(raw).cast(col.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                agree = False
            else:
                agree = col.null_count == 0 and bool(
                    pc.all(pc.equal(col, want)).as_py() or not len(col)
                )
        if not agree:
            found = pc.unique(col).to_pylist()[:3]
            raise ShardError(
                f"{redact(url)}: Hive key {key!r} is {raw!r} in the path but the file's column "
                f"holds {found}; pyarrow.dataset would read the path's value, polars the "
                "file's: make them agree (or drop the column from the files)"
            )
