"""Arrow IPC shards (``.arrow``, ``.feather``, ``.ipc``): the file format (pyarrow's
``ipc.new_file``, Feather v2) and the stream format (``ipc.new_stream``; what HF
``datasets``' ``save_to_disk`` writes), read by record batch as Parquet is read by row
group.

Both formats are a sequence of framed messages (the stream format's, after the file
format's 8-byte magic): a schema, then record batches, each ``0xFFFFFFFF``, a 4-byte
metadata length, a flatbuffer ``Message`` and its body. Indexing walks those frames from
the start, reading only each message's metadata (one small read per batch when the
batches are large, as tar headers are walked) and skipping the bodies; the index keeps
each batch's rows, offset and size. A read fetches the bytes of its batches (one range)
and decodes them with pyarrow's ``ipc.read_message`` / ``ipc.read_record_batch``, after
checking that each frame is where the index says, with the size it says: bytes from the
wrong place are a ShardError, never rows. pyarrow's readers cannot do this part: they
either open the whole stream from its start or (the file format) read the footer, which
gives batch offsets but no row counts.

Dictionary-encoded columns (dictionary batches) are refused by name.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..errors import ShardError
from ..shard import Shard
from ..storage.filesystems import FileEntry, redact
from ..storage.ranges import RangeFile
from ..storage.retry import read_ranges
from .parquet import ParquetFormat
from .parquet_fetch import Fetched, read_errors
from .parquet_meta import row_groups, schema_to_b64

__all__ = ["ArrowFormat", "walk_messages"]

_FILE_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3  # flatbuffer MessageHeader union types
_HEADER_READ = 64 << 10  # bytes read at each message header the walk reaches


def _table(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(table position, vtable position, vtable size) of the flatbuffer table at `pos`."""
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    return pos, vtable, struct.unpack_from("<H", buf, vtable)[0]


def _field(buf: bytes, table: tuple[int, int, int], index: int) -> int | None:
    """Absolute position of field `index` of a table, None when absent (the default)."""
    pos, vtable, size = table
    at = 4 + 2 * index
    if at + 2 > size:
        return None
    off = struct.unpack_from("<H", buf, vtable + at)[0]
    return pos + off if off else None


def message_header(metadata: bytes) -> tuple[int, int, int]:
    """(header type, body length, rows) of a flatbuffer Message (rows: a record batch's
    length, else 0). Message: version 0, header_type 1, header 2, bodyLength 3;
    RecordBatch: length 0."""
    root = _table(metadata, struct.unpack_from("<I", metadata, 0)[0])
    kind_at = _field(metadata, root, 1)
    kind = metadata[kind_at] if kind_at is not None else 0
    body_at = _field(metadata, root, 3)
    body = struct.unpack_from("<q", metadata, body_at)[0] if body_at is not None else 0
    rows = 0
    header_at = _field(metadata, root, 2)
    if kind == _RECORD_BATCH and header_at is not None:
        batch = _table(metadata, header_at + struct.unpack_from("<I", metadata, header_at)[0])
        length_at = _field(metadata, batch, 0)
        rows = struct.unpack_from("<q", metadata, length_at)[0] if length_at is not None else 0
    return kind, body, rows


def _frame(f: Any, pos: int) -> tuple[int, bytes] | None:
    """(frame prefix length, metadata) of the message at `pos`; None at end of stream."""
    f.seek(pos)
    head = f.read(8)
    if len(head) < 4:
        return None
    first = struct.unpack_from("<I", head, 0)[0]
    if first == _CONTINUATION:
        if len(head) < 8:
            return None
        prefix, length = 8, struct.unpack_from("<i", head, 4)[0]
    else:  # the format before Arrow 0.15: the length alone
        prefix, length = 4, struct.unpack_from("<i", head, 0)[0]
    if length == 0:
        return None  # end-of-stream marker
    f.seek(pos + prefix)
    metadata = f.read(length)
    if len(metadata) < length:
        raise EOFError(f"a message at byte {pos} runs past the end")
    return prefix, metadata


def walk_messages(f: Any, url: str, size: int) -> dict[str, Any]:
    """Index an Arrow IPC file or stream (`f`: a seekable file of `size` bytes): its schema
    and, per record batch, rows, offset and bytes (frame, metadata and body)."""
    f.seek(0)
    start = 8 if f.read(6) == _FILE_MAGIC else 0
    pos, schema = start, None
    rows: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    try:
        while pos < size:
            frame = _frame(f, pos)
            if frame is None:
                break
            prefix, metadata = frame
            kind, body, n = message_header(metadata)
            end = pos + prefix + len(metadata) + body
            if end > size:
                raise EOFError(f"a message at byte {pos} ends at {end}")
            if kind == _SCHEMA:
                schema = pa.ipc.read_schema(pa.py_buffer(_framed(metadata)))
            elif kind == _DICTIONARY:
                raise ShardError(
                    f"{redact(url)}: dictionary-encoded columns in an Arrow IPC file are not "
                    "supported; write it without dictionaries (table.cast to plain types)"
                )
            elif kind == _RECORD_BATCH:
                rows.append(n)
                offsets.append(pos)
                lengths.append(end - pos)
            pos = end
        else:
            if start == 0:
                raise EOFError(f"no end-of-stream marker in its {size} bytes")
    except (EOFError, struct.error, IndexError, pa.ArrowException) as e:
        raise ShardError(f"{redact(url)}: not a readable Arrow IPC file (truncated? {e})") from e
    if schema is None:
        raise ShardError(f"{redact(url)}: not an Arrow IPC file (no schema message)")
    return {
        "num_records": int(sum(rows)),
        "details": {
            "ipc": True,
            "row_group_rows": rows,
            "row_group_offsets": offsets,
            "row_group_bytes": lengths,
        },
        "schema": schema_to_b64(schema.remove_metadata()),
    }


def _framed(metadata: bytes) -> bytes:
    return struct.pack("<Ii", _CONTINUATION, len(metadata)) + metadata


class ArrowFormat(ParquetFormat):
    """Arrow IPC shards. Everything after the bytes (casting to the dataset's schema,
    kinds, blocks, batches) is ParquetFormat's: record batches are its row groups."""

    name = "arrow"
    suffixes = (".arrow", ".feather", ".ipc")

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """Each file's message frames walked (`walk_messages`), of its listed version."""
        out = []
        for e in entries:
            f = RangeFile(fs, e.url, e.size, self.retry, e.version)
            f.readahead(_HEADER_READ)
            out.append(walk_messages(f, e.url, e.size))
        return out

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
    ) -> list[Fetched]:
        """The bytes of the record batches holding each row range (one range read each)."""
        names, cols = self._names(columns)
        got, starts, ends = [], [], []
        d = shard.details
        for start, stop in rows:
            first_row, groups = row_groups(shard, start, stop)
            got.append(Fetched(shard, start, stop, first_row, groups, names, cols))
            starts.append(d["row_group_offsets"][groups[0]])
            ends.append(d["row_group_offsets"][groups[-1]] + d["row_group_bytes"][groups[-1]])
        indexed = [(shard.bytes, shard.version)] * len(got)
        with read_errors(shard.url, sorted({g for x in got for g in x.groups})):
            data = read_ranges(fs, [shard.url] * len(got), starts, ends, self.retry, indexed)
        for x, a, blob in zip(got, starts, data):
            x.parts = {(a, a + len(blob)): blob}
        return got

    def decode(self, fs: Any, got: Fetched) -> pa.Table:
        """The fetched batches, each frame checked against the index, as one table."""
        shard, d = got.shard, got.shard.details
        (((base, _), blob),) = got.parts.items()  # type: ignore[union-attr]
        number = d.get("schema", 0)
        if number >= len(self.file_schemas):
            raise ValueError("ArrowFormat reads with the index's schemas (file_schemas)")
        schema = self.file_schemas[number]
        batches = []
        with read_errors(shard.url, got.groups):
            for g in got.groups:
                at, n = d["row_group_offsets"][g] - base, d["row_group_bytes"][g]
                frame = memoryview(blob)[at : at + n]
                _check_frame(frame, shard.url, base + at, n, d["row_group_rows"][g])
                message = pa.ipc.read_message(pa.py_buffer(frame))
                batches.append(pa.ipc.read_record_batch(message, schema))
        table = pa.Table.from_batches(batches, schema=schema)
        if got.cols is not None:
            table = table.select(got.cols)
        part = table.slice(got.start - got.first_row, got.stop - got.start)
        return self._shape(part, shard, got.names)


def _check_frame(frame: memoryview, url: str, offset: int, size: int, rows: int) -> None:
    """The bytes at `offset` must be the record batch the index recorded: a framed
    message of `size` bytes holding `rows` rows."""
    try:
        first = struct.unpack_from("<I", frame, 0)[0]
        prefix = 8 if first == _CONTINUATION else 4
        length = struct.unpack_from("<i", frame, prefix - 4)[0]
        kind, body, n = message_header(bytes(frame[prefix : prefix + length]))
        ok = kind == _RECORD_BATCH and prefix + length + body == size and n == rows
    except (struct.error, IndexError, ValueError):
        ok = False
    if not ok:
        raise ShardError(
            f"{redact(url)}: the bytes read at {offset} are not the record batch the index "
            f"recorded ({rows} rows, {size} bytes): the shard changed, or the storage "
            "returned other bytes; rebuild the index"
        )
