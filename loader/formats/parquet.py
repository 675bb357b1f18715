"""Parquet shards: index from footers alone, read only the row groups and columns needed."""

from __future__ import annotations

import base64
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from fsspec.implementations.local import LocalFileSystem
from fsspec.parquet import AlreadyBufferedFile
from fsspec.utils import merge_offset_ranges
from torch.utils.data import get_worker_info

from ..batching import column_to_batch
from ..errors import ShardError
from ..kinds import Kind, check_length, check_part
from ..partitions import partition_arrays
from ..retry import RetryPolicy, count_fetched, read_ranges
from ..schemas import plain_type
from ..shard import Shard
from ..storage import FileEntry, check_version, redact
from .columns import Block, gather, padded
from .deferred import complete, estimated_bytes, is_deferred

__all__ = ["GROUP_BYTES", "ParquetFormat", "footer_details", "packed", "read_groups"]

_MAGIC = b"PAR1"

# A read group (the unit the loader decodes, and shuffles within: see sampler.plan) is a run
# of consecutive row groups holding at least this many stored bytes (or the shard's rest).
# Smaller row groups (pandas and HF datasets write ~1,000-row ones) are read together, so a
# group is one coalesced read and shuffles more than a few rows; larger ones stay alone.
GROUP_BYTES = 256 << 10
OPEN_FILES = 16  # local shards a decoding thread keeps open (a block's pieces and more)


def read_groups(row_rows: Sequence[int], row_bytes: Sequence[int]) -> list[int]:
    """Records of each read group of a shard whose row groups hold `row_rows` records and
    `row_bytes` stored bytes: consecutive row groups joined until GROUP_BYTES is reached.
    A pure function of the index's row-group sizes, so the reading order it shapes is the
    same wherever the index is built or loaded. Empty row groups join their neighbours."""
    out: list[int] = []
    rows = size = 0
    for n, b in zip(row_rows, row_bytes):
        rows, size = rows + int(n), size + int(b)
        if size >= GROUP_BYTES and rows:
            out.append(rows)
            rows = size = 0
    if rows:
        if out and size < GROUP_BYTES // 4:
            out[-1] += rows  # a short tail joins the group before it
        else:
            out.append(rows)
    return out


def footer_details(footer: bytes, url: str) -> tuple[pq.FileMetaData, dict[str, Any]]:
    """The parsed metadata and the index details of a Parquet footer (metadata + 4-byte
    length + magic).

    Row group i holds rows [first_row[i], first_row[i] + rows[i]) and lies in bytes
    [offsets[i], offsets[i] + lengths[i]) of the file.
    """
    try:
        meta = _parse_footer(footer)
        # schema-level metadata (pandas' index ranges, ...) differs from file to file
        schema = meta.schema.to_arrow_schema().remove_metadata()
    except (pa.ArrowException, OSError) as e:
        raise ShardError(f"{redact(url)}: not a readable Parquet file ({e})") from e
    pad = _legacy_padding(meta)
    rows, offsets, lengths = [], [], []
    # (top-level column, row group): uncompressed bytes of its leaf column chunks
    leaves = [_leaf_count(f.type) for f in schema]
    first_leaf = np.concatenate(([0], np.cumsum(leaves, dtype=np.int64)))
    plain: list[list[int]] = [[] for _ in leaves]
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        # a row group's bytes: from its first column chunk's first page to its last's end
        starts = [_chunk_start(rg.column(j)) for j in range(rg.num_columns)]
        ends = [s + rg.column(j).total_compressed_size + pad for j, s in enumerate(starts)]
        rows.append(rg.num_rows)
        offsets.append(min(starts, default=0))
        lengths.append(max(ends, default=0) - min(starts, default=0))
        for c, (a, b) in enumerate(itertools.pairwise(first_leaf.tolist())):
            plain[c].append(sum(rg.column(j).total_uncompressed_size for j in range(a, b)))
    return meta, {
        "num_records": int(meta.num_rows),
        "details": {
            "row_group_rows": rows,
            "row_group_offsets": offsets,
            "row_group_bytes": lengths,
            # per column of the file's schema, per row group: the column chunks' size
            # uncompressed (encoded pages): the reader's memory estimate
            "column_uncompressed_bytes": plain,
            "footer_bytes": len(footer),  # metadata + 4-byte length + "PAR1"
        },
        "schema": schema_to_b64(schema),
    }


def _parse_footer(footer: bytes) -> pq.FileMetaData:
    """Parquet metadata from a footer (metadata + 4-byte length + magic); pyarrow wants the
    leading magic too."""
    return pq.read_metadata(pa.BufferReader(_MAGIC + footer))


def _chunk_start(col: Any) -> int:
    """First byte of a column chunk: its dictionary page, if any, else its first data page.

    parquet-cpp's guard (PARQUET-1402): old parquet-mr writers (Spark with parquet-mr 1.8)
    set ``dictionary_page_offset = 0`` on chunks without a dictionary, so a dictionary page
    exists only where ``0 < dictionary_page_offset < data_page_offset``."""
    data = int(col.data_page_offset)
    dictionary = col.dictionary_page_offset if col.has_dictionary_page else None
    if dictionary is not None and 0 < int(dictionary) < data:
        return int(dictionary)
    return data


_LEGACY_MR = re.compile(r"parquet-mr version (\d+)\.(\d+)\.(\d+)")
_MAX_DICT_HEADER = 100  # parquet-cpp's kMaxDictHeaderSize


def _legacy_padding(meta: Any) -> int:
    """Bytes to add to each column chunk's length: parquet-mr 1.2.8 and older left the
    dictionary page header out of total_compressed_size (PARQUET-816); parquet-cpp pads
    by up to 100 bytes for them, and so do we."""
    found = _LEGACY_MR.search(meta.created_by or "")
    if found and tuple(int(x) for x in found.groups()) < (1, 2, 9):
        return _MAX_DICT_HEADER
    return 0


def _leaf_count(t: pa.DataType) -> int:
    """Parquet leaf columns an Arrow type is stored in."""
    if isinstance(t, pa.BaseExtensionType):
        return _leaf_count(t.storage_type)
    if pa.types.is_struct(t):
        return sum(_leaf_count(f.type) for f in t)
    if pa.types.is_map(t):
        return _leaf_count(t.key_type) + _leaf_count(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaf_count(t.value_type)
    return 1


def leaf_columns(meta: Any, columns: Sequence[str] | None) -> list[int]:
    """Indices of the Parquet leaf columns holding the asked top-level columns (all when
    None). By position in the schema, never by splitting dotted paths: a column may be
    named ``feat.x``."""
    key = (id(meta), None if columns is None else tuple(columns))
    hit = _LEAVES.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    out = _leaf_columns(meta, columns)
    if len(_LEAVES) > 4096:
        _LEAVES.clear()
    _LEAVES[key] = (meta, out)
    return out


# (id(meta), columns) -> (meta, leaves): the meta kept so its id is not reused meanwhile
_LEAVES: dict[tuple[int, tuple[str, ...] | None], tuple[Any, list[int]]] = {}


def _leaf_columns(meta: Any, columns: Sequence[str] | None) -> list[int]:
    fields = meta.schema.to_arrow_schema()
    if columns is None:
        return list(range(meta.num_columns))
    wanted = set(columns)
    out: list[int] = []
    at = 0
    for f in fields:
        n = _leaf_count(f.type)
        if f.name in wanted:
            out.extend(range(at, at + n))
        at += n
    return out


def schema_to_b64(schema: pa.Schema) -> str:
    """An Arrow schema as text for JSON (its IPC serialization, base64)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _check_footer(tail: bytes, entry: FileEntry) -> int:
    if entry.size < 12 or len(tail) != 8 or tail[4:] != _MAGIC:
        raise ShardError(
            f"{redact(entry.url)}: not a Parquet file (no PAR1 footer in its {entry.size} "
            "bytes; truncated or corrupt?)"
        )
    length = int.from_bytes(tail[:4], "little")
    if length + 12 > entry.size:
        raise ShardError(f"{redact(entry.url)}: Parquet footer length {length} exceeds the file")
    return length


def _row_groups(shard: Shard, start: int, stop: int) -> tuple[int, list[int]]:
    """(first row of the first group, the row groups overlapping rows [start, stop))."""
    # (G+1,) first row of each row group, then the total
    first = np.concatenate(([0], np.cumsum(shard.details["row_group_rows"])))
    g0 = int(np.searchsorted(first, start, side="right")) - 1
    g1 = int(np.searchsorted(first, stop, side="left"))
    return int(first[g0]), list(range(g0, g1))


MAX_GAP = 64_000  # fetch the gap between two needed column chunks when it is this small


def _column_ranges(
    url: str, meta: Any, groups: Sequence[int], columns: Sequence[str] | None
) -> tuple[list[int], list[int]]:
    """(starts, ends): byte ranges holding the asked columns' chunks in the given row
    groups, neighbours closer than MAX_GAP merged."""
    leaves = leaf_columns(meta, columns)
    pad = _legacy_padding(meta)
    starts, ends = [], []
    for g in groups:
        rg = meta.row_group(g)
        for j in leaves:
            col = rg.column(j)
            begin = _chunk_start(col)
            starts.append(begin)
            ends.append(begin + col.total_compressed_size + pad)
    _, starts, ends = merge_offset_ranges([url] * len(starts), starts, ends, max_gap=MAX_GAP)
    return [int(a) for a in starts], [int(b) for b in ends]


def _fetch_column_chunks(
    fs: Any,
    shard: Shard,
    meta: Any,
    groups: Sequence[int],
    columns: Sequence[str] | None,
    retry: RetryPolicy,
) -> dict[tuple[int, int], bytes]:
    """{(start, end): bytes} holding the asked columns' chunks in the given row groups, of
    the indexed version of the shard (StaleIndexError if it changed).

    fsspec.parquet.open_parquet_file computes the same ranges, but it re-reads the footer on
    every call and needs a footer sample of at least pyarrow's 64 KiB tail read; with the
    footer already parsed, we only fetch the column chunks (coalesced, concurrent on S3).
    """
    starts, ends = _column_ranges(shard.url, meta, groups, columns)
    limit = shard.bytes - int(shard.details["footer_bytes"])
    ends = [min(e, limit) for e in ends]  # the legacy padding stops at the footer
    n = len(starts)
    indexed = [(shard.bytes, shard.version)] * n
    data = read_ranges(fs, [shard.url] * n, starts, ends, retry, indexed)
    return {(a, b): blob for a, b, blob in zip(starts, ends, data)}


TAIL = 8 << 10  # indexing reads this much of a shard's end: its footer, mostly whole


FooterKey = tuple[str, int, str | None]  # url, size, version: a shard's exact bytes


class FooterCache:
    """Parsed Parquet footers by (url, size, version), least recently used dropped once their
    serialized sizes add up to more than `max_bytes` (the parsed form takes a few times
    that). Thread-safe: reader threads share it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[FooterKey, tuple[pq.FileMetaData, int]]
        self._items = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: FooterKey) -> pq.FileMetaData | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: FooterKey, meta: pq.FileMetaData, nbytes: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += nbytes - (old[1] if old else 0)
            self._items[key] = (meta, nbytes)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, n) = self._items.popitem(last=False)
                self._bytes -= n

    def __len__(self) -> int:
        return len(self._items)


# Footers parsed in this process: indexing fills it, so the process that built the index
# (and DataLoader workers forked from it) fetches no footer again; a worker reading
# several pieces of a shard fetches its footer once.
_FOOTERS = FooterCache(64 << 20)


def _cast(table: pa.Table, target: pa.Schema, url: str) -> pa.Table:
    """The table in the dataset's types, which differ from the file's only in nullability
    or list item names (checked by ShardIndex.columns_schema)."""
    for name in table.column_names:
        got, want = table.schema.field(name).type, target.field(name).type
        if not pa.types.is_null(got) and not plain_type(got).equals(plain_type(want)):
            raise ShardError(f"{redact(url)}: column {name!r} is {got}, the dataset's is {want}")
    return table.cast(target)


def packed(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The arrays as tensors that are views of one storage (each at an 8-byte aligned
    offset). A DataLoader worker sends every storage in a batch through its own
    shared-memory segment and file descriptor, which costs ~0.5 ms each here: one storage
    a batch instead of one a column (measured: 1.6 -> 1.2 ms a batch for an id and a
    tokens column)."""
    offsets, total = [], 0
    for a in arrays.values():
        total = -(-total // 8) * 8
        offsets.append(total)
        total += a.nbytes
    storage = torch.empty(total, dtype=torch.uint8)
    out = {}
    for (name, a), at in zip(arrays.items(), offsets):
        dtype = torch.from_numpy(a[:0]).dtype
        view = storage[at : at + a.nbytes].view(dtype).view(a.shape)
        view.numpy()[...] = a
        out[name] = view
    return out


class _Fetched:
    """What `ParquetFormat.fetch` got for rows [start, stop) of a shard: its footer and,
    off local disk, the bytes of the column chunks to decode."""

    def __init__(
        self,
        shard: Shard,
        start: int,
        stop: int,
        first_row: int,
        groups: list[int],
        names: list[str] | None,
        cols: list[str] | None,
    ) -> None:
        self.shard, self.start, self.stop, self.first_row = shard, start, stop, first_row
        self.groups, self.names, self.cols = groups, names, cols
        self.meta: Any = None
        self.parts: dict[tuple[int, int], bytes] | None = None


@contextmanager
def _errors(url: str, groups: Sequence[int]) -> Iterator[None]:
    """Storage and decoding errors of a read, named by the shard and its row groups."""
    try:
        yield
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(url)}: shard not found") from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(f"{redact(url)}: cannot read row groups {list(groups)}: {e}") from e


class ParquetFormat:
    """Parquet shards. For reading, `schema` is the schema of the asked columns every shard
    gives (ShardIndex.columns_schema), partition columns included (`partitioning`); with
    `kinds` (batch mode), each piece is made to fit its columns' kinds (loader.kinds)."""

    name = "parquet"
    suffixes = (".parquet", ".parq", ".pq")

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        schema: pa.Schema | None = None,
        partitioning: pa.Schema | None = None,
        kinds: dict[str, Kind] | None = None,
        lengths: dict[str, int] | None = None,
        file_schemas: Sequence[pa.Schema] | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.schema = schema
        self.partitions = [] if partitioning is None else partitioning.names
        self.partitioning = partitioning
        self.kinds = kinds
        self.file_schemas = list(file_schemas or [])  # the index's: for memory estimates
        # plain list columns without a pad value: one row length, fixed by the first read
        self._fixed = [n for n, k in (kinds or {}).items() if k.ragged and k.pad is None]
        # plain list columns: the row length first read (shared by a mixture's streams)
        self._lengths: dict[str, int] = {} if lengths is None else lengths
        self._open_files = threading.local()  # per decoding thread: the last files read

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """One batched range read of each shard's last `TAIL` bytes (fsspec's cat_ranges
        runs them concurrently on S3); a second only for footers longer than that. Each read
        is of the listed version (an S3 object rewritten meanwhile is a StaleIndexError)."""
        urls = [e.url for e in entries]
        sizes = [e.size for e in entries]
        indexed = [(e.size, e.version) for e in entries]
        starts = [max(0, n - TAIL) for n in sizes]
        tails = read_ranges(fs, urls, starts, sizes, self.retry, indexed)
        lengths = [_check_footer(t[-8:], e) for t, e in zip(tails, entries)]
        longer = [i for i, (t, n) in enumerate(zip(tails, lengths)) if n + 8 > len(t)]
        if longer:
            more = read_ranges(
                fs,
                [urls[i] for i in longer],
                [sizes[i] - 8 - lengths[i] for i in longer],
                [sizes[i] for i in longer],
                self.retry,
                [indexed[i] for i in longer],
            )
            for i, footer in zip(longer, more):
                tails[i] = footer
        out = []
        for tail, n, e in zip(tails, lengths, entries):
            meta, details = footer_details(tail[len(tail) - n - 8 :], e.url)
            _FOOTERS.put((e.url, e.size, e.version), meta, n + 8)
            out.append(details)
        return out

    def _metadata(self, fs: Any, shard: Shard) -> Any:
        key = (shard.url, shard.bytes, shard.version)
        meta = _FOOTERS.get(key)
        if meta is None:
            size, n = shard.bytes, shard.details["footer_bytes"]
            indexed = [(size, shard.version)]
            (footer,) = read_ranges(fs, [shard.url], [size - n], [size], self.retry, indexed)
            meta = _parse_footer(footer)
            _FOOTERS.put(key, meta, n)
        return meta

    def read(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> pa.Table:
        """Rows [start, stop) of the asked columns, in the dataset's column order and types,
        partition columns included: fetches the footer (once per shard and process) and
        only the column chunks of the asked columns in the row groups holding those rows.
        A shard that is no longer the indexed version raises StaleIndexError."""
        return self.decode(fs, self.fetch(fs, shard, start, stop, columns))

    def fetch(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> _Fetched:
        """The storage part of `read`: the footer and (not local) the column chunks."""
        return self.fetch_many(fs, shard, [(start, stop)], columns)[0]

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
    ) -> list[_Fetched]:
        """`fetch` of several row ranges of one shard, their column chunks read together:
        one coalesced set of ranged reads (fewer, larger requests), shared by all."""
        shard = complete(self, fs, shard)  # a shard only counted so far: its footer now
        names = list(columns) if columns is not None else None
        if names is None and self.schema is not None:
            names = self.schema.names
        cols = None if names is None else [c for c in names if c not in self.partitions]
        got = []
        for start, stop in rows:
            first_row, groups = _row_groups(shard, start, stop)
            got.append(_Fetched(shard, start, stop, first_row, groups, names, cols))
        every = sorted({g for x in got for g in x.groups})
        with _errors(shard.url, every):
            meta = self._metadata(fs, shard)
            parts = None
            if not isinstance(fs, LocalFileSystem):
                parts = _fetch_column_chunks(fs, shard, meta, every, cols, self.retry)
        for x in got:
            x.meta, x.parts = meta, parts
        return got

    def decode(self, fs: Any, got: _Fetched) -> pa.Table:
        """The decoding part of `read`: local files are read by pyarrow's own file here
        (pre-buffered, coalesced; about 20% less CPU than bytes read through fsspec)."""
        url, groups, cols = got.shard.url, got.groups, got.cols
        with _errors(url, groups):
            if got.parts is None:
                try:
                    pf = self._open(fs, got)
                    # one thread a read: several groups are decoded at once, and pyarrow's
                    # pool on top only adds contention (measured slower)
                    table = pf.read_row_groups(groups, columns=cols, use_threads=False)
                finally:  # what was read is the indexed file (or a failure is explained)
                    check_version(fs, url, got.shard.bytes, got.shard.version)
                starts, ends = _column_ranges(url, got.meta, groups, cols)  # the chunks read
                count_fetched(sum(b - a for a, b in zip(starts, ends)), len(starts))
            else:
                # pyarrow decodes from the fetched parts only: fsspec's "parts" cache serves
                # its reads, and the metadata we pass keeps it from reading the footer again
                # (a copy of the dict: the cache empties the one it is given, and the parts
                # of a fetch of several groups serve each of them)
                f = AlreadyBufferedFile(
                    fs=None,
                    path=url,
                    mode="rb",
                    cache_type="parts",
                    cache_options={"data": dict(got.parts)},
                    size=got.shard.bytes,
                )
                table = pq.ParquetFile(f, metadata=got.meta).read_row_groups(
                    groups, columns=cols, use_threads=False
                )
        part = table.slice(got.start - got.first_row, got.stop - got.start)
        return self._shape(part, got.shard, got.names)

    def _open(self, fs: Any, got: _Fetched) -> pq.ParquetFile:
        """The shard's file, opened by pyarrow with its cached footer; each decoding thread
        keeps its last few open (a shard's groups are read one after the other: opening
        the file and its reader for each took a fifth of a small group's decoding). A file
        replaced meanwhile is still caught: `decode` checks the version after each read."""
        key = (got.shard.url, got.shard.bytes, got.shard.version)
        files: OrderedDict[FooterKey, pq.ParquetFile] | None = getattr(self._open_files, "d", None)
        if files is None:
            files = self._open_files.d = OrderedDict()
        pf = files.get(key)
        if pf is None:
            pf = pq.ParquetFile(fs._strip_protocol(got.shard.url), metadata=got.meta)
            files[key] = pf
            while len(files) > OPEN_FILES:
                files.popitem(last=False)[1].close()
        files.move_to_end(key)
        return pf

    def _shape(self, table: pa.Table, shard: Shard, names: list[str] | None) -> pa.Table:
        """A piece as the dataset has it: the file's columns in the asked order, cast where
        another writer named or nulled them differently, partition values as columns, and
        (batch mode) each column fitted to its kind."""
        if self.schema is not None and names is not None:
            target = pa.schema([self.schema.field(c) for c in table.column_names])
            if not table.schema.equals(target):
                table = _cast(table, target, shard.url)
            values = shard.details.get("partitions") or {}
            asked = [c for c in names if c in self.partitions]
            for name, arr in partition_arrays(
                self.partitioning or pa.schema([]), values, table.num_rows, asked
            ).items():
                table = table.append_column(self.schema.field(name), arr)
            table = table.select(names)
        if self.kinds is not None:
            # plain list lengths are checked by `check`, in reading order (whichever thread
            # finished first must not decide a column's length), from the lengths `join`
            # measures
            table = check_part(table, self.kinds, shard.url)
        return table

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes of the row groups holding rows [start, stop), all columns."""
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop)
        _, groups = _row_groups(shard, start, stop)
        return int(sum(shard.details["row_group_bytes"][g] for g in groups))

    def groups(self, shard: Shard) -> list[int]:
        """Records of each of the shard's read groups (see `read_groups`); a shard whose
        row groups the index does not know yet (deferred: a manifest's count) is one."""
        if is_deferred(shard):
            return [shard.num_records] if shard.num_records else []
        d = shard.details
        return read_groups(d.get("row_group_rows", []), d.get("row_group_bytes", []))

    def estimate(self, shard: Shard, start: int, stop: int, columns: Sequence[str] | None) -> int:
        """About how many bytes reading rows [start, stop) of the asked columns holds in
        memory: the row groups' uncompressed column chunks (from the index), else their
        stored bytes. Encoded pages can be smaller than the decoded columns (dictionaries),
        so the reader scales this by what it measured on the groups it decoded."""
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop)
        _, groups = _row_groups(shard, start, stop)
        d = shard.details
        plain = d.get("column_uncompressed_bytes")
        number = d.get("schema", 0)
        if plain is None or number >= len(self.file_schemas):
            total = sum(d["row_group_bytes"][g] for g in groups)
        else:
            names = self.file_schemas[number].names
            wanted = set(columns) if columns is not None else set(names)
            cols = [i for i, n in enumerate(names) if n in wanted]
            total = sum(plain[c][g] for c in cols for g in groups)
        rows = sum(d["row_group_rows"][g] for g in groups)
        return int(total * (stop - start) / rows) if rows else 0

    def reserve(self, nbytes: int) -> None:
        """A hint of the bytes the reader holds at most (unused: blocks are views)."""

    def check(self, joined: Block, shard: Shard) -> None:
        """Called in reading order as each group is first needed: a plain list column's
        rows must have the length the first group read had (ShardError naming the shard)."""
        for name in self._fixed:
            lo_hi = joined.lengths.get(name)
            if lo_hi is not None:
                check_length(name, shard.url, *lo_hi, self._lengths)

    def join(self, parts: Sequence[pa.Table]) -> Block:
        """The parts as one Block (numeric columns as views of the decoded buffers).

        Arrow's free memory is not handed back to the OS here: the next groups decode
        into it. Handing it back every 4 MB (the previous design) made every decode
        touch fresh pages: 35,000 page faults a pass of the benchmark's 131,072 records,
        ~25% of the reader's CPU, and a higher peak RSS than reusing it (+102 MB against
        +75 MB, `scripts/bench.py`'s RSS growth)."""
        return Block(parts, self.kinds, self._fixed)

    def release(self, joined: Block) -> None:
        joined.release()

    def nbytes(self, joined: Block) -> int:
        """Bytes the joined block holds."""
        return joined.nbytes

    def take(self, joined: Block, indices: Any) -> dict[str, Any]:
        return joined.take(np.asarray(indices, dtype=np.int64))

    def gather(self, joined: Sequence[Block], which: Any, rows: Any) -> dict[str, Any]:
        """Row rows[k] of joined[which[k]] for each k, in order (padding is left to `cut`)."""
        return gather(joined, np.asarray(which, dtype=np.int64), np.asarray(rows, dtype=np.int64))

    def cut(self, taken: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
        """Rows [lo, hi) of what `gather` gave; padded list columns padded to their longest."""
        pads = {} if self.kinds is None else {k: v.pad for k, v in self.kinds.items() if v.ragged}
        return {
            k: padded(v[lo:hi], pads[k]) if pads.get(k) is not None else v[lo:hi]
            for k, v in taken.items()
        }

    def records(self, taken: dict[str, Any]) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
        return Block.records(taken)

    def batch(self, taken: dict[str, Any]) -> dict[str, Any]:
        """numpy columns -> tensors (they are fresh arrays: no copy; in a DataLoader worker
        they are packed into one storage, see `packed`); Arrow columns -> lists (with kinds,
        the column's kind decided that), else tensors or lists as `column_to_batch` says."""
        arrays = {k: c for k, c in taken.items() if isinstance(c, np.ndarray)}
        tensors = (
            packed(arrays)
            if len(arrays) > 1 and get_worker_info() is not None
            else {k: torch.from_numpy(c) for k, c in arrays.items()}
        )
        return {
            k: tensors[k]
            if k in tensors
            else c.to_pylist()
            if self.kinds is not None
            else column_to_batch(c)
            for k, c in taken.items()
        }
