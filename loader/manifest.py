"""Manifests: a file naming the shards with their sizes (and record counts), read instead of
listing a bucket.

A manifest is a source of its own, recognized by its name:

- ``*.manifest`` or ``*.manifest.txt``: one shard a line, ``url size [records [version]]``,
  whitespace-separated; ``-`` for a records or version field left out; blank lines and
  lines starting with ``#`` ignored.
- ``*.manifest.parquet``: columns ``url`` (string) and ``size`` (integer), optionally
  ``records`` (integer, null where unknown) and ``version`` (string: the S3 ETag, quoted
  or not, or what `loader.storage.version_of` gives).

Relative URLs are relative to the manifest's folder. Shards keep the manifest's order.
Building from a manifest lists nothing and asks storage nothing about the shards: sizes
come from it, and shards with a record count are not read at all until a reader opens
them (their row groups or members are found then: loader.formats.deferred). Parquet needs
one footer for the dataset's schema: the first shard's is read. A shard without a count
is indexed as usual. With a version, every read checks it (an S3 ETag is sent as
If-Match); without one, local reads check the size only and S3 reads nothing.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ShardError
from .retry import RetryPolicy, read_ranges
from .storage import FileEntry, file_entry, filesystem, redact

__all__ = ["MANIFEST_SUFFIXES", "ManifestRow", "is_manifest", "read_manifest"]

MANIFEST_SUFFIXES = (".manifest", ".manifest.txt", ".manifest.parquet")


@dataclass(frozen=True)
class ManifestRow:
    """One shard a manifest names: its file entry and, if given, its record count."""

    entry: FileEntry
    records: int | None


def is_manifest(source: object) -> bool:
    return isinstance(source, str) and source.lower().endswith(MANIFEST_SUFFIXES)


def _resolve(base: str, url: str) -> str:
    if "://" in url or url.startswith("/") or not base:
        return url
    return f"{base}/{url}"


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


def _row(base: str, url: str, size: Any, records: Any, version: Any, where: str) -> ManifestRow:
    count = _count(size, where, "size")
    if count is None:
        raise ValueError(f"{where}: the size of {url} is required")
    # an S3 ETag may come quoted (as S3 Inventory and the API give it)
    tag = None if version in (None, "-") else str(version).strip('"')
    entry = FileEntry(_resolve(base, url), count, tag)
    return ManifestRow(entry, _count(records, where, "records"))


def _text_rows(text: str, url: str, base: str) -> list[ManifestRow]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{redact(url)} line {number}"
        if not 2 <= len(fields) <= 4:
            raise ValueError(
                f"{where}: expected 'url size [records [version]]', got {len(fields)} fields"
            )
        records, version = [*fields[2:], None, None][:2]
        rows.append(_row(base, fields[0], fields[1], records, version, where))
    return rows


def _parquet_rows(data: bytes, url: str, base: str) -> list[ManifestRow]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{redact(url)}: not a readable Parquet manifest ({e})") from e
    missing = {"url", "size"} - set(table.column_names)
    if missing:
        raise ValueError(
            f"{redact(url)}: a Parquet manifest needs columns url and size (missing "
            f"{sorted(missing)}; optional: records, version)"
        )
    cols = {
        c: table.column(c).to_pylist()
        for c in ("url", "size", "records", "version")
        if c in table.column_names
    }
    n = table.num_rows
    shown = redact(url)
    # a column left out is None for every row (made once: building it per row was
    # quadratic, > 10 minutes for a million rows)
    records, versions = (cols.get(c, [None] * n) for c in ("records", "version"))
    return [
        _row(base, str(u), size, rec, ver, f"{shown} row {i}")
        for i, (u, size, rec, ver) in enumerate(zip(cols["url"], cols["size"], records, versions))
    ]


def read_manifest(
    url: str, storage_options: dict[str, Any] | None, retry: RetryPolicy
) -> list[ManifestRow]:
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
    if not rows:
        raise ValueError(f"{redact(url)}: the manifest names no shards")
    return rows
