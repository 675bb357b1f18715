"""Shard URLs held relative to a base.

A manifest names its shards relative to its own folder: a million shards in one folder
are a million short names, and joining the folder onto each (``s3://bucket/a/b/`` a
shard) would copy every name and add the folder's length a shard (~35 MB a million for a
bucket and two folders, with its transient copy). So a listing and the index table keep
the names as the manifest gave them, and the folder once, as their `base`: a name that is
relative (no scheme, no leading ``/``) is ``base + "/" + name``, any other is a URL of its
own (loader.storage.urls: the one rule, also a wids list's). The index table holds its
base in its schema metadata (`BASE_KEY`); a saved index holds full URLs (its file format
is unchanged).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..columns.arrow_numpy import string_scalar
from ..storage.urls import full_url, is_relative

__all__ = [
    "BASE_KEY",
    "base_of",
    "full_url",
    "full_urls",
    "is_relative",
    "relative",
    "table_urls",
    "with_base",
]

BASE_KEY = b"url_base"


def relative(urls: pa.Array) -> pa.Array:
    """Per URL: True where it has no scheme and no leading ``/`` (`is_relative`, by
    Arrow's kernels)."""
    return pc.invert(pc.or_(pc.match_substring(urls, "://"), pc.starts_with(urls, "/")))


def full_urls(base: str, urls: pa.Array) -> pa.Array:
    """Every URL of `urls` joined to `base` where relative (a new array only where one is)."""
    if not base or not len(urls):
        return urls
    rel = relative(urls)
    if not pc.any(rel).as_py():
        return urls
    joined = pc.binary_join_element_wise(string_scalar(base), urls, string_scalar("/"))
    return joined if pc.all(rel).as_py() else pc.if_else(rel, joined, urls)


def base_of(table: pa.Table) -> str:
    """The base of an index table's relative URLs ("" where it has none)."""
    meta = table.schema.metadata or {}
    return bytes(meta.get(BASE_KEY, b"")).decode()


def table_urls(table: pa.Table) -> pa.Array:
    """An index table's URLs, full (a copy where the table has a base)."""
    col = table.column("url")
    urls = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return full_urls(base_of(table), urls)


def with_base(table: pa.Table, base: str) -> pa.Table:
    """`table` with `base` as the base of its URLs (none: "")."""
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != BASE_KEY}
    if base:
        meta[BASE_KEY] = base.encode()
    return table.replace_schema_metadata(meta or None)
