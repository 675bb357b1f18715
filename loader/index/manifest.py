"""Manifests: a file naming the shards with their sizes (and record counts), read instead of
listing a bucket.

A manifest is a source of its own, recognized by its name:

- ``*.manifest`` or ``*.manifest.txt``: one shard a line, ``url size [records [version]]``,
  whitespace-separated; ``-`` for a records or version field left out; blank lines and
  lines starting with ``#`` ignored.
- ``*.manifest.parquet``: columns ``url`` (string) and ``size`` (integer), optionally
  ``records`` (integer, null where unknown) and ``version`` (string: the S3 ETag, quoted
  or not, or what `loader.storage.filesystems.version_of` gives).

Relative URLs are relative to the manifest's folder. Shards keep the manifest's order.
Building from a manifest lists nothing and asks storage nothing about the shards: sizes
come from it, and shards with a record count are not read at all until a reader opens
them (their row groups or members are found then: loader.formats.deferred). Parquet needs
one footer for the dataset's schema: the first shard's is read. A shard without a count
is indexed as usual. With a version, every read checks it (an S3 ETag is sent as
If-Match); without one, local reads check the size only and S3 reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..columns.arrays import numbers
from ..columns.arrow_numpy import string_scalar, strings
from ..errors import ShardError
from ..formats.parquet.local import pooled
from ..storage.filesystems import filesystem, redact
from ..storage.listing import file_entry
from ..storage.retry import RetryPolicy, read_ranges
from .table import flags, one_array

__all__ = ["MANIFEST_SUFFIXES", "Manifest", "is_manifest", "read_manifest"]

MANIFEST_SUFFIXES = (".manifest", ".manifest.txt", ".manifest.parquet")


@dataclass(frozen=True)
class Manifest:
    """The shards a manifest names, as columns, each (n,): `urls` (as written: a relative
    one is relative to `base`, the manifest's folder: loader.index.urls), `sizes`,
    `records` (-1 where not given) and `versions` (null where not given). A million rows
    are arrays, not a million objects."""

    urls: pa.Array
    sizes: npt.NDArray[np.int64]
    records: npt.NDArray[np.int64]
    versions: pa.Array
    base: str = ""

    def __len__(self) -> int:
        return len(self.sizes)


def is_manifest(source: object) -> bool:
    return isinstance(source, str) and source.lower().endswith(MANIFEST_SUFFIXES)


def _count(value: Any, where: str, name: str) -> int | None:
    if value is None or value == "-":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or (isinstance(value, float) and value != n):
        raise ValueError(f"{where}: {name} must be an integer >= 0 or '-', got {value!r}")
    return n


def _tags(versions: pa.Array) -> pa.Array:
    """Versions as strings, an S3 ETag's quotes (as S3 Inventory and the API give it)
    stripped, ``-`` and empty as null."""
    versions = pc.utf8_trim(versions.cast(pa.string()), '"')
    empty = pc.is_in(versions, strings(["-", ""]))
    return pc.if_else(empty, string_scalar(None), versions)


def _text_rows(text: str, url: str, base: str) -> Manifest:
    urls, sizes, records, versions = [], [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{redact(url)} line {number}"
        if not 2 <= len(fields) <= 4:
            raise ValueError(
                f"{where}: expected 'url size [records [version]]', got {len(fields)} fields"
            )
        size = _count(fields[1], where, "size")
        if size is None:
            raise ValueError(f"{where}: the size of {fields[0]} is required")
        count = _count(fields[2], where, "records") if len(fields) > 2 else None
        urls.append(fields[0])
        sizes.append(size)
        records.append(-1 if count is None else count)
        versions.append(fields[3] if len(fields) > 3 else None)
    return Manifest(
        strings(urls),
        np.array(sizes, dtype=np.int64),
        np.array(records, dtype=np.int64),
        _tags(strings(versions)),
        base,
    )


def _integers(table: pa.Table, name: str, url: str, required: bool) -> npt.NDArray[np.int64]:
    """Column `name` as int64 (-1 for null), checked: ValueError naming the first bad row."""
    col = one_array(table.column(name))
    if pa.types.is_integer(col.type) and not col.null_count:
        # the usual column: a view of its buffer, checked without a temporary a row
        values = numbers(col).astype(np.int64, copy=False)
        if len(values) and values.min() < 0:
            row = int(np.argmax(values < 0))
            raise ValueError(
                f"{redact(url)} row {row}: {name} must be an integer >= 0 or '-', "
                f"got {int(values[row])!r}"
            )
        return values
    shown = redact(url)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        text = col.cast(pa.string())
        col = pc.if_else(pc.equal(text, string_scalar("-")), string_scalar(None), text)
        try:
            col = col.cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            for row, value in enumerate(col.to_pylist()):
                _count(value, f"{shown} row {row}", name)  # raises at the first bad one
            raise
    values = col.fill_null(0).to_numpy() if pa.types.is_floating(col.type) else numbers(col)
    nulls = flags(col.is_null())
    if required and nulls.any():
        row = int(np.flatnonzero(nulls)[0])
        raise ValueError(f"{shown} row {row}: the size of {table.column('url')[row]} is required")
    filled = np.where(nulls, 0, values)
    bad = (filled < 0) | (filled != np.floor(filled))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{shown} row {row}: {name} must be an integer >= 0 or '-', got {col[row].as_py()!r}"
        )
    return np.where(nulls, -1, filled).astype(np.int64)


def _parquet_rows(data: bytes, url: str, base: str) -> Manifest:
    # the bytes as they are (a BytesIO copies each page out, 3x the time), decoded into the
    # read pool: pyarrow's default (mimalloc) kept ~30 MB more of a million rows' decode
    # (not read_table: it imports pandas)
    buffer = pa.py_buffer(data)
    try:
        f = pq.ParquetFile(pa.BufferReader(buffer))
        wanted = [c for c in ("url", "size", "records", "version") if c in f.schema_arrow.names]
        table = pooled(f, pa.BufferReader(buffer)).read(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{redact(url)}: not a readable Parquet manifest ({e})") from e
    missing = {"url", "size"} - set(table.column_names)
    if missing:
        raise ValueError(
            f"{redact(url)}: a Parquet manifest needs columns url and size (missing "
            f"{sorted(missing)}; optional: records, version)"
        )
    n = table.num_rows
    urls = one_array(table.column("url")).cast(pa.string())
    # columns, not a row object each: a million rows in well under a second
    sizes = _integers(table, "size", url, required=True)
    records = (
        _integers(table, "records", url, required=False)
        if "records" in table.column_names
        else np.full(n, -1, dtype=np.int64)
    )
    versions = (
        _tags(one_array(table.column("version")))
        if "version" in table.column_names
        else pa.nulls(n, pa.string())
    )
    return Manifest(urls, sizes, records, versions, base)


def read_manifest(url: str, storage_options: dict[str, Any] | None, retry: RetryPolicy) -> Manifest:
    """The shards a manifest names, in its order. FileNotFoundError when it is missing,
    ValueError naming the line or row that is malformed, or when it names no shard."""
    fs, _ = filesystem(url, storage_options)
    entry = file_entry(url, storage_options)
    try:
        (data,) = read_ranges(fs, [url], [0], [entry.size], retry)
    except ShardError as e:
        raise ValueError(f"{redact(url)}: cannot read the manifest: {e}") from e
    base = url.rsplit("/", 1)[0] if "/" in url else ""
    if url.lower().endswith(".parquet"):
        rows = _parquet_rows(data, url, base)
    else:
        rows = _text_rows(data.decode("utf-8"), url, base)
    if not len(rows):
        raise ValueError(f"{redact(url)}: the manifest names no shards")
    return rows
