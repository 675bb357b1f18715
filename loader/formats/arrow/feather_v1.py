"""Feather version 1 shards: ``.feather`` files that begin and end with ``FEA1``, the format
before Arrow IPC, which pyarrow still reads (``pyarrow.feather.read_table``; it deprecated
writing them in 25.0).

A version 1 file has no record batches: each column is one run of buffers, described by
the metadata at the file's end, so its rows cannot be read by range as an Arrow IPC file's
are read by batch. A shard is one read group holding all its rows, fetched whole in one
ranged read of its indexed version (loader.storage.retry.read_ranges: short, long or
other-version bytes are an error naming the shard, never rows) and decoded by pyarrow's
own Feather reader from those bytes; every column is then validated in full before Python
reads it (loader.formats.arrow.format), as Arrow IPC columns are. Ranks or workers sharing a
version 1 shard each read it whole (the plan's bytes show it). Indexing reads each file
whole too: pyarrow's reader gives a version 1 file's schema only by reading its table.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from ...errors import ShardError
from ...storage.filesystems import FileEntry, redact
from ...storage.retry import RetryPolicy, read_ranges

__all__ = [
    "FEATHER_V1",
    "MAGIC",
    "batches_of",
    "details_of",
    "fetch_whole",
    "is_feather_v1",
    "read_v1",
]

MAGIC = b"FEA1"
FEATHER_V1 = "feather1"  # the index's "ipc" detail of a version 1 shard


def is_feather_v1(head: bytes) -> bool:
    """Whether a file beginning with `head` is a Feather version 1 file."""
    return head[:4] == MAGIC


def fetch_whole(fs: Any, url: str, size: int, version: str | None, retry: RetryPolicy) -> bytes:
    """The whole file, of the indexed (listed) size and version."""
    (blob,) = read_ranges(fs, [url], [0], [size], retry, [(size, version)])
    return bytes(blob)


def read_v1(blob: bytes, url: str) -> pa.Table:
    """The table pyarrow's Feather reader reads from a version 1 file's bytes, its lengths
    checked (its columns' values not validated yet: `check_column` does, before anything
    reads them); ShardError naming the file when the bytes are not a file it reads safely.

    pyarrow reads a version 1 file's metadata (a flatbuffer) without verifying it, and
    aborts the process on some values (a category of non-integer codes, a time32 column in
    microseconds): `_verify` checks every part of it pyarrow's reader touches first."""
    if len(blob) < 12 or blob[:4] != MAGIC or blob[-4:] != MAGIC:
        raise ShardError(
            f"{redact(url)}: not a Feather version 1 file (it does not begin and end with "
            "FEA1): the shard changed, or the storage returned other bytes; rebuild the index"
        )
    try:
        _verify(blob)
        reader = _reader(pa.BufferReader(blob))
        if reader.version >= 3:  # (an Arrow IPC file: not what the index recorded)
            raise ValueError("an Arrow IPC file, not Feather version 1")
        table: pa.Table = reader.read()
        table.validate()  # each column num_rows long, its buffers large enough (no values read)
        if any(c.num_chunks != 1 for c in table.columns):
            raise ValueError("a column of other than one chunk")
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, struct.error) as e:
        raise ShardError(f"{redact(url)}: not a readable Feather version 1 file ({e})") from e
    return table


def batches_of(table: pa.Table) -> list[pa.RecordBatch]:
    """A table `read_v1` gave as record batches of its columns' own chunks (no slicing,
    which would count nulls of values not validated yet)."""
    if not table.num_rows:
        return []
    columns = [c.chunk(0) for c in table.columns]
    return [pa.RecordBatch.from_arrays(columns, schema=table.schema)]


# --- the metadata: flatbuffers, verified ---------------------------------------------------
#
# feather.fbs (Arrow's cpp/src/arrow/ipc/feather.fbs), as field numbers:
#   CTable:            description 0 (string), num_rows 1 (long), columns 2 ([Column]),
#                      version 3 (int), metadata 4 (string)
#   Column:            name 0 (string), values 1 (PrimitiveArray), metadata_type 2 (ubyte),
#                      metadata 3 (table), user_metadata 4 (string)
#   PrimitiveArray:    type 0 (byte), encoding 1 (byte), offset 2, length 3, null_count 4,
#                      total_bytes 5 (longs)
#   CategoryMetadata:  levels 0 (PrimitiveArray), ordered 1 (bool)
#   TimestampMetadata: unit 0 (byte), timezone 1 (string); TimeMetadata: unit 0 (byte)

_CATEGORY, _TIMESTAMP, _DATE, _TIME = 1, 2, 3, 4  # the TypeMetadata union's members
_INTEGERS = range(1, 9)  # Type: INT8 .. UINT64 (a category's codes)
_PRIMITIVES = {*range(0, 13), 17, 18}  # the Types pyarrow's reader reads as themselves
_OFFSET_WIDTH = {11: 4, 12: 4, 17: 8, 18: 8}  # UTF8, BINARY, LARGE_UTF8, LARGE_BINARY
_SCALARS = {"b": 1, "B": 1, "i": 4, "q": 8}


class _Flat:
    """Reads a flatbuffer's tables, each position checked to lie inside the buffer."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def read(self, fmt: str, at: int) -> int:
        if at < 0 or at + struct.calcsize(fmt) > len(self.buf):
            raise ValueError(f"the metadata points outside itself (byte {at})")
        value: int = struct.unpack_from("<" + fmt, self.buf, at)[0]
        return value

    def table(self, at: int) -> tuple[int, int, int, int]:
        """(position, vtable, vtable bytes, table bytes) of the table at `at`."""
        vtable = at - self.read("i", at)
        size, tsize = self.read("H", vtable), self.read("H", vtable + 2)
        if (
            size < 4
            or size % 2
            or vtable + size > len(self.buf)
            or at + max(tsize, 4) > len(self.buf)
        ):
            raise ValueError(f"a damaged metadata table at byte {at}")
        return at, vtable, size, tsize

    def _field(self, t: tuple[int, int, int, int], index: int, nbytes: int) -> int | None:
        at, vtable, size, tsize = t
        slot = 4 + 2 * index
        if slot + 2 > size:
            return None
        offset = self.read("H", vtable + slot)
        if not offset:
            return None
        if offset + nbytes > tsize:
            raise ValueError(f"a metadata field outside its table at byte {at}")
        return at + offset

    def scalar(self, t: tuple[int, int, int, int], index: int, fmt: str, default: int = 0) -> int:
        at = self._field(t, index, _SCALARS[fmt])
        return default if at is None else self.read(fmt, at)

    def _target(self, t: tuple[int, int, int, int], index: int) -> int | None:
        at = self._field(t, index, 4)
        return None if at is None else at + self.read("I", at)

    def sub(self, t: tuple[int, int, int, int], index: int) -> tuple[int, int, int, int] | None:
        at = self._target(t, index)
        return None if at is None else self.table(at)

    def string(self, t: tuple[int, int, int, int], index: int) -> bool:
        """Whether the string field is there (checked, its NUL terminator included)."""
        at = self._target(t, index)
        if at is None:
            return False
        if at + 4 + self.read("I", at) + 1 > len(self.buf):
            raise ValueError(f"a metadata string at byte {at} runs past the metadata")
        return True

    def tables(self, t: tuple[int, int, int, int], index: int) -> list[tuple[int, int, int, int]]:
        at = self._target(t, index)
        if at is None:
            raise ValueError("no column list")
        n = self.read("I", at)
        if at + 4 + 4 * n > len(self.buf):
            raise ValueError(f"a metadata list at byte {at} runs past the metadata")
        return [self.table(at + 4 + 4 * i + self.read("I", at + 4 + 4 * i)) for i in range(n)]


def _verify(blob: bytes) -> None:
    """ValueError unless every part of the metadata pyarrow's version 1 reader touches is
    inside the metadata and holds what the reader can take without aborting, and every
    array's buffers (as the reader cuts them from its bytes) lie inside the file."""
    length = struct.unpack_from("<I", blob, len(blob) - 8)[0]
    if not 8 <= length <= len(blob) - 12:
        raise ValueError(f"a metadata length of {length} in a file of {len(blob)} bytes")
    flat = _Flat(blob[len(blob) - 8 - length : len(blob) - 8])
    root = flat.table(flat.read("I", 0))
    rows, version = flat.scalar(root, 1, "q"), flat.scalar(root, 3, "i")
    if not 0 <= rows <= 8 * len(blob):
        raise ValueError(f"{rows} rows in a file of {len(blob)} bytes")
    flat.string(root, 0)
    flat.string(root, 4)
    for i, column in enumerate(flat.tables(root, 2)):
        values = flat.sub(column, 1)
        if not flat.string(column, 0) or values is None:
            raise ValueError(f"column {i} has no name or no values")
        flat.string(column, 4)
        kind, meta = flat.scalar(column, 2, "B"), flat.sub(column, 3)
        if kind in (_CATEGORY, _TIMESTAMP, _TIME) and meta is None:
            raise ValueError(f"column {i} has no type metadata")
        value_type = flat.scalar(values, 0, "b")
        plain = kind not in (_CATEGORY, _TIMESTAMP, _DATE, _TIME)
        if (plain and value_type not in _PRIMITIVES) or (
            kind == _CATEGORY and value_type not in _INTEGERS
        ):
            raise ValueError(f"column {i} of type {value_type} (type metadata {kind})")
        _array(flat, values, value_type if plain else 0, i, version, len(blob), rows)
        if kind == _CATEGORY and meta is not None:
            levels = flat.sub(meta, 0)
            level_type = -1 if levels is None else flat.scalar(levels, 0, "b")
            if levels is None or level_type not in _PRIMITIVES:
                raise ValueError(f"column {i}: category levels of type {level_type}")
            _array(flat, levels, level_type, i, version, len(blob), None)
            flat.scalar(meta, 1, "B")
        elif kind == _TIMESTAMP and meta is not None:
            if flat.scalar(meta, 0, "b") not in range(4):
                raise ValueError(f"column {i}: a timestamp of an unknown unit")
            flat.string(meta, 1)
        elif kind == _TIME and meta is not None and flat.scalar(meta, 0, "b") not in (0, 1):
            raise ValueError(f"column {i}: a time32 column of a unit other than s or ms")


def _array(
    flat: _Flat,
    t: tuple[int, int, int, int],
    value_type: int,
    column: int,
    version: int,
    size: int,
    rows: int | None,
) -> None:
    """A PrimitiveArray's fields checked: its bytes inside the file, and the buffers
    pyarrow's reader cuts from them (validity bitmap when it has nulls, offsets for
    strings and binaries of `value_type`, then values) inside its bytes: the reader cuts
    them unchecked, and validation reads offsets through them."""
    at, n, nulls, nbytes = (flat.scalar(t, index, "q") for index in range(2, 6))
    flat.scalar(t, 1, "b")
    if rows is not None and n != rows:
        raise ValueError(f"column {column} holds {n} of {rows} rows")
    if not (0 <= n <= 8 * size and 0 <= nulls <= n and at >= 0 and 0 <= nbytes <= size - at):
        raise ValueError(f"column {column}: {n} values at [{at}, {at} + {nbytes}), {nulls} nulls")

    def stored(k: int) -> int:  # the reader's GetOutputLength: padded to 8 from version 2
        return k if version < 2 else -(-k // 8) * 8

    cut = stored(-(-n // 8)) if nulls else 0
    cut += stored((n + 1) * _OFFSET_WIDTH.get(value_type, 0)) if value_type in _OFFSET_WIDTH else 0
    if cut > nbytes:
        raise ValueError(f"column {column}: {nbytes} bytes cannot hold its {n} values' buffers")


def _reader(source: Any) -> Any:
    """pyarrow's Feather reader, on one thread: the class ``pyarrow.feather.read_table``
    reads with, which warns of version 1 files on every read (a user's file is not this
    library's deprecated use)."""
    from pyarrow._feather import FeatherReader

    return FeatherReader(source, use_memory_map=False, use_threads=False)


def details_of(entry: FileEntry, table: pa.Table) -> dict[str, Any]:
    """The index details of a version 1 shard: one read group of all its rows, the whole
    file (none for an empty file, as an Arrow IPC file without batches has none)."""
    n = table.num_rows
    return {
        "ipc": FEATHER_V1,
        "row_group_rows": [n] if n else [],
        "row_group_offsets": [0] if n else [],
        "row_group_bytes": [entry.size] if n else [],
    }
