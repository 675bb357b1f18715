"""What write_shards reads: any source as a line of records in units (files) of known
counts, each readable by row range as Arrow tables of one schema.

- ``IndexedSource``: anything ``StreamingDataset`` reads (Parquet, Arrow IPC, tar, a
  ``datasets.Dataset``, a saved index, on any store): its ShardIndex gives the counts, and
  rows are read a read group (a row group, a run of tar members) at a time by the
  format's own reader, as the dataset reads them.
- ``TextSource``: JSON Lines and CSV files, read by pyarrow's streaming readers. Their
  counts and schema come from one pass over every file (``count_text``, run in the
  writer's processes); the files' schemas unified are given to every later read, so every
  block of every file parses to the one schema.
- An iterable of dicts, a ``pyarrow.Table`` or a pandas DataFrame is first spilled to
  Arrow IPC files under ``DEST/_input/`` (``spill``), then read as an IndexedSource: the
  writer's processes each read their share of it, and a resumed write reuses a finished
  spill.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
from fsspec.core import has_magic

from shardstream.loader.formats import Format, format_for
from shardstream.loader.formats.partitions import is_hidden
from shardstream.loader.index.shard_index import ShardIndex
from shardstream.loader.storage.filesystems import FileEntry, as_url, filesystem, redact
from shardstream.loader.storage.listing import file_entry, list_files

__all__ = [
    "TEXT_SUFFIXES",
    "IndexedSource",
    "Source",
    "TextSource",
    "count_text",
    "is_in_memory",
    "locate",
    "text_entries",
]

TEXT_SUFFIXES = {
    "json": (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".jsonl.zst", ".jsonl.bz2"),
    "csv": (".csv", ".csv.gz", ".csv.zst", ".csv.bz2"),
}
_META = ("__url__", "__local_path__")  # webdataset's per-sample fields that are not data


def _text_kind(url: str) -> str | None:
    lower = url.lower()
    for kind, suffixes in TEXT_SUFFIXES.items():
        if lower.endswith(suffixes):
            return kind
    return None


def is_in_memory(source: object) -> bool:
    """Whether `source` is records in memory (spilled before writing): a pyarrow Table,
    a pandas DataFrame, or an iterable that is not a URL, a list of URLs or a dataset."""
    if isinstance(source, str | bytes | os.PathLike | ShardIndex):
        return False
    if isinstance(source, pa.Table | pa.RecordBatch):
        return True
    if type(source).__module__.startswith("datasets"):
        return False
    if type(source).__name__ == "DataFrame":
        return True
    if isinstance(source, list | tuple):
        return bool(source) and not isinstance(source[0], str | os.PathLike)
    return isinstance(source, Iterable)


def text_entries(
    source: Any, storage_options: dict[str, Any] | None, folders: bool = False
) -> tuple[str, list[FileEntry]] | None:
    """(kind, files) where `source` names JSON Lines or CSV files only (files, globs, and
    with `folders` folders or prefixes, listed); None where it names none of them.
    ValueError where text files and other files are mixed."""
    source = as_url(source)
    urls = [source] if isinstance(source, str) else source
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        return None
    if not folders and not any(_text_kind(u) for u in urls):
        return None
    entries: list[FileEntry] = []
    for url in urls:
        if _text_kind(url) and not has_magic(url):
            entries.append(file_entry(url, storage_options))
        elif has_magic(url) or folders:
            entries += [e for e in list_files(url, storage_options) if not is_hidden(e.relpath)]
        else:
            entries.append(FileEntry(url, -1, None))
    kinds = {_text_kind(e.url) for e in entries}
    if kinds == {None} or not entries:
        return None
    if None in kinds or len(kinds) > 1:
        odd = [e.url for e in entries if _text_kind(e.url) != _text_kind(entries[0].url)]
        raise ValueError(
            f"{redact(str(urls[0]))}: JSON Lines and CSV files are read alone, not mixed "
            f"with each other or with shards; e.g. {redact(odd[0] if odd else urls[0])}"
        )
    kind = next(k for k in kinds if k)
    return kind, entries


class Source:
    """A line of records in units; subclasses say how to read rows [a, b) of a unit."""

    counts: list[int]  # records of each unit
    names: list[str]  # each unit's URL, for errors
    schema: pa.Schema
    stored_bytes: int

    @property
    def num_records(self) -> int:
        return sum(self.counts)

    def read(self, unit: int, start: int, stop: int) -> Iterator[pa.Table]:
        """Rows [start, stop) of unit `unit`, as tables of `schema`, in order."""
        raise NotImplementedError

    def identity(self) -> str:
        """A digest of what was read (URLs, sizes, versions): a resumed write checks it."""
        raise NotImplementedError


@dataclass
class IndexedSource(Source):
    """A source StreamingDataset reads, by its ShardIndex."""

    index: ShardIndex
    columns: list[str] | None
    storage_options: dict[str, Any] | None
    spilled: bool = False  # our own spill of records in memory: known by content
    _fmt: Format | None = field(default=None, repr=False)
    # the read group the next shard's records begin in: (unit, first row, its table)
    _held: tuple[int, int, pa.Table] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.counts = [int(n) for n in self.index.shard_sizes.tolist()]
        self.names = [s.url for s in self.index.shards]
        self.stored_bytes = self.index.stored_bytes()
        if self.index.format == "tar":
            seen, _ = self.index.shards.extensions()
            keys = sorted(set(seen) - set(_META))
            keys = [k for k in keys if self.columns is None or k in self.columns]
            self.schema = pa.schema(
                [pa.field("__key__", pa.string())] + [pa.field(k, pa.binary()) for k in keys]
            )
        else:
            self.schema = self.index.columns_schema(self.columns)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fmt": None, "_held": None}

    def _format(self) -> Format:
        if self._fmt is None:
            if self.index.format == "tar":
                self._fmt = format_for("tar")
            else:
                self._fmt = format_for(
                    self.index.format or "parquet",
                    schema=self.schema,
                    partitioning=self.index.partitioning,
                    file_schemas=self.index.schemas,
                )
        return self._fmt

    def read(self, unit: int, start: int, stop: int) -> Iterator[pa.Table]:
        """A read group at a time, each fetched and decoded once: a group that runs past
        `stop` is held for the next shard's records (a process writes runs of
        consecutive shards), so a shard bound inside a group does not decode it twice."""
        shard = self.index.shards[unit]
        fmt = self._format()
        fs, _ = filesystem(shard.url, self.storage_options)
        lo = 0
        for n in fmt.groups(shard):
            first, last = lo, lo + n
            lo = last
            a, b = max(start, first), min(stop, last)
            if a >= b:
                continue
            held = self._held
            if held is not None and held[:2] == (unit, first):
                table, base = held[2], first
            elif last > stop:  # the next shard begins in this group: read it whole
                table, base = self._as_table(fmt.read(fs, shard, first, last, self.columns)), first
            else:
                table, base = self._as_table(fmt.read(fs, shard, a, b, self.columns)), a
            self._held = (unit, first, table) if last > stop else None
            yield table.slice(a - base, b - a)
            if last >= stop:
                break

    def _as_table(self, got: Any) -> pa.Table:
        return self._table(got) if isinstance(got, list) else got

    def _table(self, samples: list[dict[str, Any]]) -> pa.Table:
        """Tar samples as a table: ``__key__`` and each extension's bytes (null where a
        sample has none)."""
        cols = {
            f.name: [s.get(f.name) for s in samples] for f in self.schema
        }  # (webdataset's samples are dicts; the schema names every extension)
        return pa.Table.from_pydict(cols, schema=self.schema)

    def identity(self) -> str:
        rows = [
            [s.url, s.bytes, None if self.spilled else s.version, s.num_records]
            for s in self.index.shards
        ]
        return _digest([rows, self.columns])


@dataclass
class TextSource(Source):
    """JSON Lines or CSV files (`kind` "json" or "csv"), counted by `count_text`."""

    kind: str
    entries: list[FileEntry]
    counted: list[tuple[int, pa.Schema, int]]  # per file: (records, schema, bytes)
    columns: list[str] | None
    storage_options: dict[str, Any] | None

    def __post_init__(self) -> None:
        self.counts = [n for n, _, _ in self.counted]
        self.names = [e.url for e in self.entries]
        self.stored_bytes = sum(b for *_, b in self.counted)
        schemas = [s for n, s, _ in self.counted if n]
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else None
        if schema is None:
            schema = pa.schema([])
        if self.columns is not None:
            missing = [c for c in self.columns if c not in schema.names]
            if missing:
                raise ValueError(f"columns {missing} are in none of the files: {schema.names}")
            schema = pa.schema([schema.field(c) for c in self.columns])
        self.schema = schema

    def read(self, unit: int, start: int, stop: int) -> Iterator[pa.Table]:
        at = 0
        for batch in _text_batches(self.kind, self.entries[unit].url, self.storage_options, self):
            n = batch.num_rows
            a, b = max(start - at, 0), min(stop - at, n)
            at += n
            if a < b:
                yield pa.Table.from_batches([batch.slice(a, b - a)])
            if at >= stop:
                return

    def identity(self) -> str:
        rows = [[e.url, b, e.version, n] for e, (n, _, b) in zip(self.entries, self.counted)]
        return _digest([self.kind, rows, self.columns])


def _text_batches(
    kind: str, url: str, storage_options: dict[str, Any] | None, source: TextSource | None
) -> Iterator[pa.RecordBatch]:
    """The file's record batches, parsed to `source`'s schema (None: inferred); errors
    name the file."""
    fs, path = filesystem(url, storage_options)
    try:
        with fs.open(path, "rb", compression="infer") as f:
            if kind == "json":
                parse = pjson.ParseOptions(
                    explicit_schema=None if source is None else _full(source),
                    newlines_in_values=False,
                )
                reader = pjson.open_json(f, parse_options=parse)
            else:
                convert = pcsv.ConvertOptions(
                    column_types=None if source is None else _full(source)
                )
                reader = pcsv.open_csv(f, convert_options=convert)
            for batch in reader:
                if source is not None:
                    batch = batch.select(source.schema.names)
                yield batch
    except (pa.ArrowInvalid, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"{redact(url)}: not readable as {_KIND_NAMES[kind]}: {e}") from e


_KIND_NAMES = {"json": "JSON Lines", "csv": "CSV"}


def _full(source: TextSource) -> pa.Schema:
    """Every file's columns unified (a read parses them all, then selects `columns`)."""
    schemas = [s for n, s, _ in source.counted if n]
    return pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])


def count_text(
    kind: str, entry: FileEntry, storage_options: dict[str, Any] | None
) -> tuple[int, pa.Schema, int]:
    """(records, schema, bytes) of one text file, from one streaming pass. Where a later
    block's types differ from the first's (the streaming readers infer from the first
    block), the file is read whole and its types inferred over every row."""
    fs, path = filesystem(entry.url, storage_options)
    size = entry.size
    try:
        n, schema = 0, None
        for batch in _text_batches(kind, entry.url, storage_options, None):
            n += batch.num_rows
            schema = batch.schema if schema is None else schema
        return n, schema or pa.schema([]), size
    except ValueError:
        pass  # retried whole, below; a file that is not readable at all raises there
    try:
        with fs.open(path, "rb", compression="infer") as f:
            table = pjson.read_json(f) if kind == "json" else pcsv.read_csv(f)
    except (pa.ArrowInvalid, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"{redact(entry.url)}: not readable as {_KIND_NAMES[kind]}: {e}") from e
    return table.num_rows, table.schema, size


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:32]


def locate(source: Source, start: int, stop: int) -> Callable[[int], str]:
    """Names the file of row i of records [start, stop) of `source` (for errors)."""
    pieces = unit_pieces(source.counts, start, stop)

    def name(i: int) -> str:
        at = 0
        for unit, lo, hi in pieces:
            if i < at + hi - lo:
                return f"{redact(source.names[unit])} (its record {lo + i - at})"
            at += hi - lo
        return redact(source.names[pieces[-1][0]]) if pieces else "no input"

    return name


def unit_pieces(counts: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """(unit, a, b) pieces of records [start, stop) of the line of units of `counts`."""
    out, lo = [], 0
    for unit, n in enumerate(counts):
        a, b = max(start, lo), min(stop, lo + n)
        if a < b:
            out.append((unit, a - lo, b - lo))
        lo += n
        if lo >= stop:
            break
    return out
