"""What a Parquet read fetched (`Fetched`), how its column chunks are fetched, and the
helpers that turn its decoded table into a batch: the fetch half of loader.formats.parquet.format,
shared with loader.formats.arrow.format."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from fsspec.utils import merge_offset_ranges

from ...columns.views import has_view, unview, without_views
from ...errors import ShardError
from ...shard import Shard
from ...storage.filesystems import redact
from ...storage.retry import RetryPolicy, read_ranges
from ..schemas import plain_type
from .meta import FOOTERS, MAX_GAP, column_ranges

__all__ = [
    "Fetched",
    "cast_to",
    "chunk_bytes",
    "exact_fetcher",
    "fetch_beside_footer",
    "fetch_column_chunks",
    "file_names",
    "in_dataset_types",
    "packed",
    "read_errors",
]


def fetch_column_chunks(
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
    starts, ends = column_ranges(shard.url, meta, groups, columns)
    limit = shard.bytes - int(shard.details["footer_bytes"])
    ends = [min(e, limit) for e in ends]  # the legacy padding stops at the footer
    n = len(starts)
    indexed = [(shard.bytes, shard.version)] * n
    data = read_ranges(fs, [shard.url] * n, starts, ends, retry, indexed)
    return {(a, b): blob for a, b, blob in zip(starts, ends, data)}


def fetch_beside_footer(
    fmt: Any, fs: Any, shard: Shard, groups: Sequence[int], columns: Sequence[str] | None
) -> dict[tuple[int, int], bytes] | None:
    """`fetch_column_chunks`' parts of a shard whose footer this process does not hold,
    sent with the footer's read (which `fmt`, a ParquetFormat, then parses and holds):
    where the index records the column chunks' places, a first read is one round trip,
    not the footer's and then the chunks'. None where the footer is held, or the index
    does not record them (saved before it did): the caller reads as always.

    The ranges cover each asked column's leaf chunks (MAX_GAP merged, as `column_ranges`);
    a read pyarrow makes outside them is fetched, never zero-filled (PartsFile)."""
    d, names = shard.details, file_names(shard, fmt.file_schemas)
    at, size = d.get("column_chunk_offsets"), d.get("column_chunk_bytes")
    held = FOOTERS.get((shard.url, shard.bytes, shard.version)) is not None
    if held or at is None or size is None or names is None or len(at) != len(names):
        return None
    wanted = None if columns is None else set(columns)
    cols = [c for c, name in enumerate(names) if wanted is None or name in wanted]
    starts = [at[c][g] for g in groups for c in cols]
    ends = [at[c][g] + size[c][g] for g in groups for c in cols]
    _, starts, ends = merge_offset_ranges([shard.url] * len(starts), starts, ends, MAX_GAP)
    footer = shard.bytes - int(d["footer_bytes"])
    starts, ends = [footer, *starts], [shard.bytes, *(min(int(e), footer) for e in ends)]
    indexed = [(shard.bytes, shard.version)] * len(starts)
    data = read_ranges(fs, [shard.url] * len(starts), starts, ends, fmt.retry, indexed)
    fmt.metadata(fs, shard, data[0])
    return {(a, b): blob for a, b, blob in zip(starts[1:], ends[1:], data[1:])}


_CHUNK_BYTES: dict[tuple[Any, ...], tuple[int, int]] = {}
CHUNK_BYTES_HELD = 1 << 14  # reads whose bytes are kept (~200 bytes each)


def chunk_bytes(got: Fetched) -> tuple[int, int]:
    """(bytes, ranges) of the column chunks a local read of `got` reads, as `column_ranges`
    finds them (the stats count them): the same every epoch, so kept, by shard, row groups
    and columns (~20 us a read to find)."""
    shard, cols = got.shard, got.cols
    asked = None if cols is None else tuple(cols)
    key = (shard.url, shard.bytes, shard.version, tuple(got.groups), asked)
    known = _CHUNK_BYTES.get(key)
    if known is None:
        starts, ends = column_ranges(shard.url, got.meta, got.groups, cols)
        known = (sum(b - a for a, b in zip(starts, ends)), len(starts))
        if len(_CHUNK_BYTES) >= CHUNK_BYTES_HELD:  # (a bound: clear() is atomic)
            _CHUNK_BYTES.clear()
        _CHUNK_BYTES[key] = known
    return known


def exact_fetcher(fs: Any, shard: Shard, retry: RetryPolicy) -> Callable[[int, int], bytes]:
    """Exact bytes [start, end) of the indexed version of the shard."""
    indexed = [(shard.bytes, shard.version)]

    def fetch(start: int, end: int) -> bytes:
        return read_ranges(fs, [shard.url], [start], [end], retry, indexed)[0]

    return fetch


def file_names(shard: Shard, file_schemas: Sequence[pa.Schema]) -> list[str] | None:
    """The shard file's top-level columns (its schema in the index), None if not known."""
    number = shard.details.get("schema", 0)
    return file_schemas[number].names if number < len(file_schemas) else None


def in_dataset_types(
    table: pa.Table, schema: pa.Schema, url: str, held: dict[tuple[str, ...], pa.Schema]
) -> pa.Table:
    """The table in the dataset's types of its columns (`schema`'s; `cast_to` where they
    differ). `held` keeps the dataset's schema of each set of columns (made afresh it cost
    ~10 us a group)."""
    key = tuple(table.column_names)
    target = held.get(key)
    if target is None:
        target = held[key] = pa.schema([schema.field(c) for c in key])
    return table if table.schema.equals(target) else cast_to(table, target, url)


def cast_to(table: pa.Table, target: pa.Schema, url: str) -> pa.Table:
    """The table in the dataset's types, which differ from the file's only in nullability,
    list item names, offset widths or views (checked by ShardIndex.columns_schema; views
    made plain by loader.columns.views, not by a cast: see there)."""
    for i, name in enumerate(table.column_names):
        got, want = table.schema.field(name).type, target.field(name).type
        if not pa.types.is_null(got) and not plain_type(got).equals(plain_type(want)):
            raise ShardError(
                f"{redact(url)}: column {name!r} is {got}, the dataset's is {want}"
                + (_REBUILD if isinstance(got, pa.BaseExtensionType) else "")
            )
        if has_view(got):
            try:
                col = pa.chunked_array(
                    [unview(c) for c in table.column(i).chunks], without_views(got)
                )
            except (TypeError, pa.ArrowException) as e:
                raise ShardError(
                    f"{redact(url)}: column {name!r} ({got}) cannot be read: {e}"
                ) from e
            table = table.set_column(i, table.field(i).with_type(col.type), col)
    return table.cast(target)


# an index built before extension types were indexed as pyarrow reads them (as storage)
_REBUILD = " (an index built by an older shardstream? rebuild it)"


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


class Fetched:
    """What `ParquetFormat.fetch` got for rows [start, stop) of a shard: its footer and,
    off local disk, the bytes of the column chunks to decode (`parts`; `cached`: none,
    the decode reads them, from the node cache)."""

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
        # remote, its chunks not fetched: read as the decode asks (through the node cache)
        self.cached = False


@contextmanager
def read_errors(url: str, groups: Sequence[int]) -> Iterator[None]:
    """Storage and decoding errors of a read, named by the shard and its row groups."""
    try:
        yield
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(url)}: shard not found") from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(f"{redact(url)}: cannot read row groups {list(groups)}: {e}") from e
