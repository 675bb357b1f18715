"""Parquet footers: parsing, the index's details, byte ranges of row groups and columns,
and the cache of parsed footers."""

from __future__ import annotations

import base64
import bisect
import functools
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.utils import merge_offset_ranges

from ...errors import ShardError
from ...shard import Shard
from ...storage.filesystems import FileEntry, redact
from ..schemas import plain_type
from .thrift import encrypted_columns

__all__ = [
    "FOOTERS",
    "GROUP_BYTES",
    "SCANS",
    "TAIL",
    "UNREADABLE",
    "FooterCache",
    "check_footer",
    "column_ranges",
    "footer_details",
    "leaf_columns",
    "parse_footer",
    "read_groups",
    "read_schema",
    "row_groups",
    "schema_from_b64",
    "schema_to_b64",
]

_MAGIC = b"PAR1"

# A read group (the unit the loader decodes, and shuffles within: see sampler.plan) is a run
# of consecutive row groups holding at least this many stored bytes (or the shard's rest).
# Smaller row groups (pandas and HF datasets write ~1,000-row ones) are read together, so a
# group is one coalesced read and shuffles more than a few rows; larger ones stay alone.
GROUP_BYTES = 256 << 10


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
        meta = parse_footer(footer)
    except UNREADABLE as e:  # a damaged footer: names that are not UTF-8, bad Thrift, ...
        raise ShardError(f"{redact(url)}: not a readable Parquet file ({e!r})") from e
    # pyarrow aborts the process when asked for the metadata of a column chunk holding
    # encryption metadata (loader.formats.parquet.thrift): walked before any is touched
    try:
        encrypted = encrypted_columns(footer[:-8])
    except ValueError as e:
        raise ShardError(f"{redact(url)}: not a readable Parquet file ({e})") from e
    if encrypted:
        raise ShardError(
            f"{redact(url)}: an encrypted Parquet file (columns encrypted under a plaintext "
            "footer, Parquet modular encryption; or a damaged footer saying so): "
            "shardstream reads no encrypted files; decrypt it first "
            "(pyarrow.parquet with a CryptoFactory and its keys)"
        )
    try:
        return meta, _details(meta, footer, url)
    except ShardError:
        raise
    except UNREADABLE as e:
        raise ShardError(f"{redact(url)}: not a readable Parquet file ({e!r})") from e


def _details(meta: pq.FileMetaData, footer: bytes, url: str) -> dict[str, Any]:
    """footer_details' index details of parsed metadata (a damaged footer can make any of
    pyarrow's accessors raise: footer_details names the file)."""
    # schema-level metadata (pandas' index ranges, ...) differs from file to file
    schema = read_schema(meta, footer).remove_metadata()
    text = _checked_schema(schema)
    pad = _legacy_padding(meta)
    rows, offsets, lengths = [], [], []
    # (top-level column, row group): uncompressed bytes of its leaf column chunks
    leaves = [_leaf_count(f.type) for f in schema]
    first_leaf = np.concatenate(([0], np.cumsum(leaves, dtype=np.int64)))
    plain: list[list[int]] = [[] for _ in leaves]
    # (top-level column, row group): its leaf chunks' first byte, and bytes to their end
    chunk_at: list[list[int]] = [[] for _ in leaves]
    chunk_bytes: list[list[int]] = [[] for _ in leaves]
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        # each column chunk's metadata made once (pyarrow makes a new object a call)
        cols = [rg.column(j) for j in range(rg.num_columns)]
        # a row group's bytes: from its first column chunk's first page to its last's end
        starts = [_chunk_start(c) for c in cols]
        ends = [s + c.total_compressed_size + pad for c, s in zip(cols, starts)]
        if rg.num_rows < 0:
            raise ShardError(
                f"{redact(url)}: row group {i} says it holds {rg.num_rows} rows: a damaged "
                "footer (a count cannot be negative)"
            )
        rows.append(rg.num_rows)
        offsets.append(min(starts, default=0))
        lengths.append(max(ends, default=0) - min(starts, default=0))
        for c, (a, b) in enumerate(itertools.pairwise(first_leaf.tolist())):
            plain[c].append(sum(col.total_uncompressed_size for col in cols[a:b]))
            at = min(starts[a:b], default=0)
            chunk_at[c].append(at)
            chunk_bytes[c].append(max(ends[a:b], default=at) - at)
    return {
        # the row groups' counts: parquet-rs 0.3 wrote num_rows 0 above row groups holding
        # rows, and pyarrow reads the row groups' rows
        "num_records": int(sum(rows)),
        "details": {
            "row_group_rows": rows,
            "row_group_offsets": offsets,
            "row_group_bytes": lengths,
            # per column of the file's schema, per row group: the column chunks' size
            # uncompressed (encoded pages): the reader's memory estimate
            "column_uncompressed_bytes": plain,
            # per column, per row group: where its chunks lie, so a reader fetches them
            # beside the footer, not after it (ParquetFormat.fetch_many)
            "column_chunk_offsets": chunk_at,
            "column_chunk_bytes": chunk_bytes,
            "footer_bytes": len(footer),  # metadata + 4-byte length + "PAR1"
        },
        "schema": text,
    }


def read_schema(meta: pq.FileMetaData, footer: bytes) -> pa.Schema:
    """The Arrow schema pyarrow's Parquet readers read the file as (`ParquetFile`,
    `read_table`, and ours: loader.formats.parquet.local), the schema the index records.
    Not ``meta.schema.to_arrow_schema()``: with their default ``arrow_extensions_enabled``
    those readers read Parquet logical types that have an Arrow extension type (UUID,
    JSON: duckdb writes both) as that type, which `to_arrow_schema` gives as its storage
    type (``fixed_size_binary[16]``, ``string``). ~25 us a footer."""
    return pq.ParquetFile(pa.BufferReader(_MAGIC + footer), metadata=meta).schema_arrow


# what pyarrow raises on a damaged footer: ArrowInvalid / OSError, and ValueError (a
# UnicodeDecodeError for names that are not UTF-8), KeyError, IndexError from its Python
UNREADABLE = (pa.ArrowException, OSError, ValueError, KeyError, IndexError)


def _checked_schema(schema: pa.Schema) -> str:
    """The schema as text (`schema_to_b64`), checked to read back as the index will read
    it: pyarrow can derive from a damaged footer a schema it cannot read again (a fixed
    size binary of a negative width). Checked once a distinct schema."""
    text = schema_to_b64(schema)
    _check_schema_text(text)
    return text


@functools.lru_cache(maxsize=4096)  # a failed check is not cached: it raises every time
def _check_schema_text(text: str) -> None:
    """Raise what pyarrow raises if the schema does not read back, or if one of its
    columns' types does not compare as the index compares them (schemas.plain_type)."""
    for f in schema_from_b64(text):
        plain_type(f.type)


def parse_footer(footer: bytes) -> pq.FileMetaData:
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


_MR = re.compile(r"parquet-mr(?: version (\d+)\.(\d+)\.(\d+))?")
_MAX_DICT_HEADER = 100  # parquet-cpp's kMaxDictHeaderSize


def _legacy_padding(meta: Any) -> int:
    """Bytes to add to each column chunk's length: parquet-mr 1.2.8 and older left the
    dictionary page header out of total_compressed_size (PARQUET-816); parquet-cpp pads
    by up to 100 bytes for them, and so do we. As in parquet-cpp's ApplicationVersion, a
    ``created_by`` of parquet-mr without a version is version 0.0.0: padded too."""
    found = _MR.match((meta.created_by or "").strip())
    if found is None:
        return 0
    version = tuple(int(x) for x in found.groups()) if found.group(1) else (0, 0, 0)
    return _MAX_DICT_HEADER if version < (1, 2, 9) else 0


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


def check_footer(tail: bytes, entry: FileEntry) -> int:
    """The footer's length from a Parquet file's last 8 bytes (`tail`); ShardError naming
    the file if they are not a plain Parquet footer (encrypted, truncated, not Parquet)."""
    if entry.size >= 12 and len(tail) == 8 and tail[4:] == b"PARE":
        raise ShardError(
            f"{redact(entry.url)}: an encrypted Parquet file (encrypted footer, magic PARE: "
            "Parquet modular encryption): shardstream reads no encrypted files; decrypt it "
            "first (pyarrow.parquet with a CryptoFactory and its keys)"
        )
    if entry.size < 12 or len(tail) != 8 or tail[4:] != _MAGIC:
        raise ShardError(
            f"{redact(entry.url)}: not a Parquet file (no PAR1 footer in its {entry.size} "
            "bytes; truncated or corrupt?)"
        )
    length = int.from_bytes(tail[:4], "little")
    if length + 12 > entry.size:
        raise ShardError(f"{redact(entry.url)}: Parquet footer length {length} exceeds the file")
    return length


def row_groups(shard: Shard, start: int, stop: int) -> tuple[int, list[int]]:
    """(first row of the first group, the row groups overlapping rows [start, stop))."""
    # (G+1,) first row of each row group, then the total (Python's: a few times a read
    # group, where numpy's calls cost ~10 us each)
    first = list(itertools.accumulate(shard.details["row_group_rows"], initial=0))
    g0 = bisect.bisect_right(first, start) - 1
    g1 = bisect.bisect_left(first, stop)
    # a group of no records (empty, or none of its rows selected: loader.formats.selected)
    # is not read
    return int(first[g0]), [g for g in range(g0, g1) if first[g + 1] > first[g]]


MAX_GAP = 64_000  # fetch the gap between two needed column chunks when it is this small


def column_ranges(
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


TAIL = 8 << 10  # indexing reads this much of a shard's end: its footer, mostly whole


FooterKey = tuple[str, int, str | None]  # url, size, version: a shard's exact bytes
T = TypeVar("T")


class FooterCache(Generic[T]):
    """Parsed Parquet footers (or another thing read once a shard) by (url, size, version),
    least recently used dropped once their serialized sizes add up to more than `max_bytes`
    (the parsed form takes a few times that). Thread-safe: reader threads share it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[FooterKey, tuple[T, int]]
        self._items = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: FooterKey) -> T | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: FooterKey, meta: T, nbytes: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += nbytes - (old[1] if old else 0)
            self._items[key] = (meta, nbytes)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, n) = self._items.popitem(last=False)
                self._bytes -= n

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Forget everything (as a fresh process would have nothing)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


# Footers parsed in this process: indexing fills it, so the process that built the index
# (and DataLoader workers forked from it) fetches no footer again; a worker reading
# several pieces of a shard fetches its footer once.
FOOTERS: FooterCache[pq.FileMetaData] = FooterCache(64 << 20)
# What indexing found in a shard (its `scan` result) by the exact bytes it read: a dataset
# made again in this process indexes those shards without reading them
SCANS: FooterCache[dict[str, Any]] = FooterCache(16 << 20)
