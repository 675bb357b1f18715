"""Listing: the shards of a source before they are indexed, as columns.

A source of a million shards (a manifest) is a million URLs: held as Python objects that
is about a gigabyte and tens of seconds of object creation, so a listing keeps its URLs,
sizes and versions as Arrow and numpy arrays, and what is known of each shard before
reading it (a record count, whether its reader may index it, a tar sidecar) as arrays too.
`entry(i)` and `hint(i)` give one shard's as objects, for the code that reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..columns.arrow_numpy import arrow_of, strings
from ..storage.filesystems import FileEntry
from .table import flags, numbers, one_array
from .urls import full_url

__all__ = ["Hint", "Listing"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Hint:
    """What is known of a shard before reading it: a record count (from a manifest or a
    wids list: `origin` names it), whether the shard may be left for its reader to index
    (`defer`), and a DALI sidecar to read instead of the shard."""

    records: int | None = None
    origin: str = ""
    defer: bool = False
    sidecar: FileEntry | None = None


def _strings(values: Sequence[str | None] | pa.Array) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = one_array(values)
    if isinstance(values, pa.Array):
        return values.cast(pa.string()) if values.type != pa.string() else values
    return strings(values)


class Listing:
    """The shards of a source in index order, their one format, and a hint for each.

    Columns, each (n,): `urls`, `versions` and `relpaths` (Arrow strings; a version may be
    null), `sizes` (bytes), `records` (a count a manifest or wids list gives; -1: none),
    `defer` (the reader may index the shard), `origins` (what gave the count, dictionary
    encoded: a manifest's million shards name one origin), and the sidecars of the shards
    that have one. A relative URL is relative to `base` (a manifest's folder:
    loader.index.urls); `url(i)` is the full one. Plain data: broadcast to ranks, pickled
    to worker processes (Arrow arrays pickle as their buffers)."""

    def __init__(
        self,
        format: str,
        entries: Sequence[FileEntry] = (),
        hints: Sequence[Hint | None] = (),
    ) -> None:
        self.format = format
        self.base = ""
        self.urls = _strings([e.url for e in entries])
        self.sizes: I64 = np.array([e.size for e in entries], dtype=np.int64)
        self.versions = _strings([e.version for e in entries])
        self.relpaths = _strings([e.relpath for e in entries])
        n = len(entries)
        self.records: I64 = np.full(n, -1, dtype=np.int64)
        self.defer = np.zeros(n, dtype=bool)
        self.origins = pa.nulls(n, pa.string()).dictionary_encode()
        self.sidecars: dict[int, FileEntry] = {}
        # a deferred shard whose footer is read for the dataset's schema (it stays deferred)
        self.schema_shard: int | None = None
        if hints:
            self.set_hints(hints)

    @classmethod
    def of_columns(
        cls,
        format: str,
        urls: pa.Array,
        sizes: I64,
        versions: pa.Array,
        records: I64 | None = None,
        origin: str = "",
        base: str = "",
    ) -> Listing:
        """A listing of arrays as they are (a manifest's): shards with a count (>= 0) in
        `records` are deferred, their count's origin `origin`; relative URLs relative to
        `base`."""
        out = cls(format)
        out.base = base
        n = len(urls)
        out.urls, out.versions = _strings(urls), _strings(versions)
        out.sizes = np.asarray(sizes, dtype=np.int64)
        out.relpaths = pa.nulls(n, pa.string())
        out.records = np.full(n, -1, np.int64) if records is None else records.astype(np.int64)
        out.defer = out.records >= 0
        # one origin for all: dictionary-encoded, 4 bytes a shard
        out.origins = pa.DictionaryArray.from_arrays(
            arrow_of(np.zeros(n, dtype=np.int32), mask=~out.defer), strings([origin])
        )
        return out

    def set_hints(self, hints: Sequence[Hint | None]) -> None:
        """Replace the hints by a list of one (or None) per shard."""
        n = len(self)
        if len(hints) != n:
            raise ValueError(f"{len(hints)} hints for {n} shards")
        self.records = np.array(
            [-1 if h is None or h.records is None else h.records for h in hints], dtype=np.int64
        )
        self.defer = np.array([h is not None and h.defer for h in hints], dtype=bool)
        self.origins = strings(
            [None if h is None or not h.origin else h.origin for h in hints]
        ).dictionary_encode()
        self.sidecars = {
            i: h.sidecar for i, h in enumerate(hints) if h is not None and h.sidecar is not None
        }

    def __len__(self) -> int:
        return len(self.sizes)

    def url(self, i: int) -> str:
        """Shard i's full URL."""
        return full_url(self.base, str(self.urls[i].as_py()))

    def entry(self, i: int) -> FileEntry:
        rel = self.relpaths[i].as_py()
        return FileEntry(self.url(i), int(self.sizes[i]), self.versions[i].as_py(), rel or "")

    @property
    def entries(self) -> list[FileEntry]:
        """Every shard's entry (objects: for a part's few shards, not a million)."""
        return [self.entry(i) for i in range(len(self))]

    def hint(self, i: int) -> Hint | None:
        records = int(self.records[i])
        side = self.sidecars.get(i)
        if records < 0 and side is None and not self.defer[i]:
            return None
        return Hint(None if records < 0 else records, self.origin(i), bool(self.defer[i]), side)

    def origin(self, i: int) -> str:
        return str(self.origins[i].as_py() or "")

    def part(self, indices: Sequence[int] | I64) -> Listing:
        """The listing of the shards at `indices`, in that order."""
        at = np.asarray(indices, dtype=np.int64)
        out = Listing(self.format)
        out.base = self.base
        take = arrow_of(at)
        out.urls, out.versions = self.urls.take(take), self.versions.take(take)
        out.relpaths, out.origins = self.relpaths.take(take), self.origins.take(take)
        out.sizes, out.records, out.defer = self.sizes[at], self.records[at], self.defer[at]
        where = {int(j): k for k, j in enumerate(at.tolist())}
        out.sidecars = {where[i]: s for i, s in self.sidecars.items() if i in where}
        out.schema_shard = where.get(self.schema_shard) if self.schema_shard is not None else None
        return out

    def to_buffer(self) -> pa.Buffer:
        """The listing as one Arrow IPC stream (its columns, the rest in the schema's
        metadata): what rank 0 broadcasts, a few bytes a shard."""
        meta = {
            "format": self.format,
            "base": self.base,
            "schema_shard": self.schema_shard,
            "sidecars": [
                [i, e.url, e.size, e.version, e.relpath] for i, e in self.sidecars.items()
            ],
        }
        table = pa.table(
            {
                "url": self.urls,
                "size": arrow_of(self.sizes),
                "version": self.versions,
                "relpath": self.relpaths,
                "records": arrow_of(self.records),
                "defer": arrow_of(self.defer),
                "origin": self.origins,
            }
        ).replace_schema_metadata({b"listing": json.dumps(meta).encode()})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue()

    @classmethod
    def from_buffer(cls, data: Any) -> Listing:
        """The listing `to_buffer` wrote (`data`: bytes or any buffer; its arrays are views
        of it)."""
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        meta = json.loads(table.schema.metadata[b"listing"])
        out = cls(meta["format"])
        out.base = meta["base"]
        out.urls, out.versions = one_array(table["url"]), one_array(table["version"])
        out.relpaths, out.origins = one_array(table["relpath"]), one_array(table["origin"])
        out.sizes = np.asarray(numbers(table["size"]), dtype=np.int64)
        out.records = np.asarray(numbers(table["records"]), dtype=np.int64)
        out.defer = flags(table["defer"])
        out.sidecars = {int(i): FileEntry(u, int(n), v, r) for i, u, n, v, r in meta["sidecars"]}
        out.schema_shard = meta["schema_shard"]
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Listing):
            return NotImplemented
        return (
            self.format == other.format
            and self.base == other.base
            and self.urls.equals(other.urls)
            and np.array_equal(self.sizes, other.sizes)
            and self.versions.equals(other.versions)
            and np.array_equal(self.records, other.records)
            and np.array_equal(self.defer, other.defer)
            and self.sidecars == other.sidecars
            and self.schema_shard == other.schema_shard
        )

    def __repr__(self) -> str:
        return f"Listing({self.format!r}, {len(self)} shards)"
