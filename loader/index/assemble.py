"""Assembling the index table from a scanned listing, in any number of parts.

`scanned_rows` turns what scanning some shards gave (dicts, loader.index.build.scan) into an
Arrow table of those shards' rows (position in the listing, records, Parquet schema, the
layout columns of loader.index.table); `assemble_rows` lays the parts over the listing's
columns. Under torch.distributed each rank scans a share and sends its rows as Arrow IPC
bytes (loader.index.distributed): arrays, not pickled objects, so a million shards
gather in a fraction of a second. Deferred shards (a manifest's counts) have no rows: they
cost the listing's arrays and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..columns.arrow_numpy import arrow_of, strings
from ..formats.parquet.meta import schema_from_b64
from ..formats.partitions import hive_values, partition_schema
from ..formats.schemas import unify_schemas
from ..storage.filesystems import filesystem
from .listing import Listing
from .table import LAYOUT, flags, layout_columns, numbers, one_array, shard_table
from .urls import is_relative

__all__ = ["assemble", "assemble_rows", "from_ipc", "scanned_rows", "to_ipc"]

log = logging.getLogger(__name__)

_TEXT = "schema_text"  # a scanned Parquet shard's schema, base64 (loader.formats.parquet.meta)


def scanned_rows(
    scanned: Sequence[dict[str, Any] | None], positions: Sequence[int] | np.ndarray | None = None
) -> pa.Table:
    """The scanned shards (entries not None) as a table: `position` (in the listing:
    `positions[k]` for entry k, else k), `records`, `schema_text` and the layout columns."""
    where = range(len(scanned)) if positions is None else positions
    at = [int(p) for p, s in zip(where, scanned) if s is not None]
    rows = [s for s in scanned if s is not None]
    columns: dict[str, Any] = {
        "position": arrow_of(np.array(at, dtype=np.int64)),
        "records": arrow_of(np.array([int(s["num_records"]) for s in rows], dtype=np.int64)),
        _TEXT: strings([s.get("schema") for s in rows]),
    }
    columns.update(layout_columns([s["details"] for s in rows]))
    return pa.table(columns)


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def assemble(
    listing: Listing,
    scanned: Sequence[dict[str, Any] | None],
    storage_options: dict[str, Any] | None,
) -> tuple[pa.Table, list[pa.Schema], pa.Schema | None]:
    """`assemble_rows` of one part: what a single process scanned."""
    return assemble_rows(listing, [scanned_rows(scanned)], storage_options)


def assemble_rows(
    listing: Listing, parts: Sequence[pa.Table], storage_options: dict[str, Any] | None
) -> tuple[pa.Table, list[pa.Schema], pa.Schema | None]:
    """(index table, distinct Parquet schemas in listing order, Hive partitioning) of a
    listing and the rows its scanned shards gave (`scanned_rows` parts, any order): what
    ``ShardIndex(table=...)`` takes. Pure: every rank that assembles the same inputs gets
    the same index. O(shards) in arrays; Python objects only for scanned shards' schemas
    and for shards in ``key=value`` folders."""
    name, n = listing.format, len(listing)
    rows = pa.concat_tables(list(parts), promote_options="default")
    rows = rows.take(arrow_of(np.argsort(numbers(rows.column("position")), kind="stable")))
    at = numbers(rows.column("position")).astype(np.int64)
    records = listing.records.copy()
    records[at] = numbers(rows.column("records"))
    # (int32 where it fits: a million-shard manifest's other ranks hold 4 MB less)
    place: np.ndarray = np.full(n, -1, dtype=np.int32 if n < 2**31 else np.int64)
    place[at] = np.arange(at.size)
    take = arrow_of(place, mask=place < 0)
    layout = {k: rows.column(k).take(take) for k in LAYOUT if k in rows.column_names}
    schemas: list[pa.Schema] = []
    texts = one_array(rows.column(_TEXT)) if at.size else pa.nulls(0, pa.string())
    if name in ("parquet", "arrow") and pc.any(pc.is_valid(texts)).as_py():
        distinct = pc.unique(texts.drop_null())  # in first-seen (listing) order
        schemas = [schema_from_b64(t) for t in distinct.to_pylist()]
        layout["schema"] = pc.index_in(texts, value_set=distinct).cast(pa.int32()).take(take)
    if listing.defer.any():
        origins = listing.origins  # dictionary-encoded: one manifest, many shards
        empty = ~listing.defer | flags(origins.is_null())
        layout["deferred"] = pa.DictionaryArray.from_arrays(
            arrow_of(numbers(origins.indices), mask=empty), origins.dictionary
        )
    partitioning = None
    if name in ("parquet", "arrow") and n:
        partitioning = _hive(listing, schemas, layout, storage_options)
    table = shard_table(
        listing.urls, listing.sizes, listing.versions, records, layout, listing.base
    )
    log.info("indexed %d %s shards, %d records", n, name, int(records.sum()))
    return table, schemas, partitioning


def _hive(
    listing: Listing,
    schemas: Sequence[pa.Schema],
    layout: dict[str, pa.Array],
    storage_options: dict[str, Any] | None,
) -> pa.Schema | None:
    """The Hive partitioning of a columnar listing's ``key=value`` folders; `layout` gets
    the ``partitions`` and ``hive_values`` columns of its shards (only shards whose path
    holds a ``=`` are looked at one by one). A shard's path is the one below the source
    where it has one (a listed folder), its name where relative to the listing's base (a
    manifest's: folders below the manifest's, as listing that folder finds them), else
    its URL's whole path (a list of URLs)."""
    # each shard's relpath where it has one, else its name as the listing holds it (no
    # copy of a million URLs)
    named = np.flatnonzero(
        np.where(
            flags(pc.is_valid(listing.relpaths)),
            flags(pc.match_substring(listing.relpaths, "=")),
            flags(pc.match_substring(listing.urls, "=")),
        )
    )
    if not named.size:
        return None
    fs, _ = filesystem(listing.url(0), storage_options)
    values: dict[int, dict[str, str | None]] = {}
    for i in named.tolist():
        rel = listing.relpaths[i].as_py()
        name = str(listing.urls[i].as_py())
        if rel is None and listing.base and is_relative(name):
            rel = name
        values[i] = hive_values(rel or fs._strip_protocol(listing.url(i)))
    inside = set(unify_schemas(list(schemas)).names) if schemas else set()
    # a key the files hold as a column too (polars writes both) is read from the files, as
    # polars' own hive reader does, and the path's value kept, so a read checks that the
    # two agree
    keys = [f for f in partition_schema(list(values.values())) if f.name not in inside]
    partitioning = pa.schema(keys) if keys else None
    parts: list[dict[str, Any] | None] = [None] * len(listing)
    both: list[dict[str, Any] | None] = [None] * len(listing)
    for i, v in values.items():
        if partitioning is not None:
            parts[i] = {k: v[k] for k in partitioning.names if k in v}
        both[i] = {k: x for k, x in v.items() if k in inside} or None
    for key, got in (("partitions", parts), ("hive_values", both)):
        column = layout_columns([None if g is None else {key: g} for g in got]).get(key)
        if column is not None:
            layout[key] = column
    return partitioning
