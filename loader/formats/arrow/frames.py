"""The message frames of an Arrow IPC file or stream, walked for the index.

Both formats are a sequence of framed messages (the stream format's, after the file
format's 8-byte magic): a schema, dictionary batches, record batches, each ``0xFFFFFFFF``
(absent before Arrow 0.15), a 4-byte metadata length, a flatbuffer ``Message`` and its
body. The walk reads only each message's metadata (one small read per message when bodies
are large, as tar headers are walked) and skips the bodies; the index keeps, per record
batch, its rows, offset and size, and where the schema and dictionary messages are.

pyarrow's readers cannot give this: they read a stream from its start, and the file
format's footer gives batch offsets but no row counts. Decoding is theirs
(loader.formats.arrow.format): this module reads a few integers of each message's
flatbuffer, every one bounds-checked, and never builds an array.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from ...errors import ShardError
from ...storage.filesystems import redact

__all__ = ["CONTINUATION", "DICTIONARY", "RECORD_BATCH", "SCHEMA", "message_header", "walk"]

FILE_MAGIC = b"ARROW1"
CONTINUATION = 0xFFFFFFFF
SCHEMA, DICTIONARY, RECORD_BATCH = 1, 2, 3  # flatbuffer MessageHeader union types


def _table(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(table position, vtable position, vtable size) of the flatbuffer table at `pos`."""
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    if not 0 <= vtable < len(buf):
        raise IndexError(f"a flatbuffer vtable at {vtable} outside the message")
    return pos, vtable, struct.unpack_from("<H", buf, vtable)[0]


def _field(buf: bytes, table: tuple[int, int, int], index: int) -> int | None:
    """Absolute position of field `index` of a table, None when absent (the default)."""
    pos, vtable, size = table
    at = 4 + 2 * index
    if at + 2 > size:
        return None
    off = struct.unpack_from("<H", buf, vtable + at)[0]
    return pos + off if off else None


def _subtable(buf: bytes, table: tuple[int, int, int], index: int) -> tuple[int, int, int] | None:
    at = _field(buf, table, index)
    return None if at is None else _table(buf, at + struct.unpack_from("<I", buf, at)[0])


def message_header(metadata: bytes) -> tuple[int, int, int, int, bool]:
    """(header type, body length, rows, dictionary id, is delta) of a flatbuffer Message:
    rows is a record batch's length (a dictionary batch's, for one); id and delta are a
    dictionary batch's (else 0, False). Message: version 0, header_type 1, header 2,
    bodyLength 3; RecordBatch: length 0; DictionaryBatch: id 0, data 1, isDelta 2."""
    root = _table(metadata, struct.unpack_from("<I", metadata, 0)[0])
    kind_at = _field(metadata, root, 1)
    kind = metadata[kind_at] if kind_at is not None else 0
    body_at = _field(metadata, root, 3)
    body = struct.unpack_from("<q", metadata, body_at)[0] if body_at is not None else 0
    rows, ident, delta = 0, 0, False
    header = _subtable(metadata, root, 2)
    if kind == DICTIONARY and header is not None:
        id_at = _field(metadata, header, 0)
        ident = struct.unpack_from("<q", metadata, id_at)[0] if id_at is not None else 0
        delta_at = _field(metadata, header, 2)
        delta = bool(metadata[delta_at]) if delta_at is not None else False
        header = _subtable(metadata, header, 1)
    if kind in (RECORD_BATCH, DICTIONARY) and header is not None:
        length_at = _field(metadata, header, 0)
        rows = struct.unpack_from("<q", metadata, length_at)[0] if length_at is not None else 0
    return kind, body, rows, ident, delta


def _frame(f: Any, pos: int) -> tuple[int, bytes] | None:
    """(frame prefix length, metadata) of the message at `pos`; None at end of stream."""
    f.seek(pos)
    head = f.read(8)
    if len(head) < 4:
        return None
    first = struct.unpack_from("<I", head, 0)[0]
    if first == CONTINUATION:
        if len(head) < 8:
            return None
        prefix, length = 8, struct.unpack_from("<i", head, 4)[0]
    else:  # the format before Arrow 0.15: the length alone
        prefix, length = 4, struct.unpack_from("<i", head, 0)[0]
    if length == 0:
        return None  # end-of-stream marker
    if length < 0:
        raise EOFError(f"a message at byte {pos} has a negative length ({length})")
    f.seek(pos + prefix)
    metadata = f.read(length)
    if len(metadata) < length:
        raise EOFError(f"a message at byte {pos} runs past the end")
    return prefix, metadata


def walk(f: Any, url: str, size: int) -> tuple[pa.Schema, dict[str, Any]]:
    """The schema and the index details of an Arrow IPC file or stream (`f`: a seekable
    file of `size` bytes): per record batch its rows, offset and bytes (frame, metadata and
    body); the stream format's schema message [offset, bytes] or the file format's footer
    [offset, bytes to the end]; per dictionary batch [offset, bytes, record batches before
    it, id, is delta]. Raises ShardError naming the file when the bytes are not such a
    file."""
    f.seek(0)
    head = f.read(6)  # (Feather version 1 files are not walked: loader.formats.arrow.feather_v1)
    try:
        if head == FILE_MAGIC:
            schema, details = _walk_file(f, url, size)
        else:
            schema, details = _walk_stream(f, size)
    except (EOFError, struct.error, IndexError, pa.ArrowException) as e:
        raise ShardError(f"{redact(url)}: not a readable Arrow IPC file (truncated? {e})") from e
    if schema is None:
        raise ShardError(f"{redact(url)}: not an Arrow IPC file (no schema message)")
    if not details["ipc_dictionaries"]:
        del details["ipc_dictionaries"]
    return schema, details


def _message(f: Any, pos: int, limit: int) -> tuple[int, int, int, int, bool, bytes] | None:
    """(kind, end, rows, dictionary id, is delta, metadata) of the message at `pos`, None
    at an end-of-stream marker; EOFError when it runs past `limit`."""
    frame = _frame(f, pos)
    if frame is None:
        return None
    prefix, metadata = frame
    kind, body, n, ident, delta = message_header(metadata)
    if body < 0 or n < 0:
        raise EOFError(f"a message at byte {pos} has a negative size ({body}, {n} rows)")
    end = pos + prefix + len(metadata) + body
    if end > limit:
        raise EOFError(f"a message at byte {pos} ends at {end}, past {limit}")
    return kind, end, n, ident, delta, metadata


def _walk_stream(f: Any, size: int) -> tuple[pa.Schema | None, dict[str, Any]]:
    """The stream format: its messages one after the other, to the end-of-stream marker."""
    pos, schema = 0, None
    d: dict[str, Any] = {"ipc": "stream", "ipc_schema": None, "ipc_dictionaries": []}
    rows: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    while True:
        if pos >= size:
            raise EOFError(f"no end-of-stream marker in its {size} bytes")
        message = _message(f, pos, size)
        if message is None:
            break
        kind, end, n, ident, delta, metadata = message
        if kind == SCHEMA and schema is None:
            schema = pa.ipc.read_schema(pa.py_buffer(framed(metadata)))
            d["ipc_schema"] = [pos, end - pos]
        elif kind == DICTIONARY:
            d["ipc_dictionaries"].append([pos, end - pos, len(rows), ident, int(delta)])
        elif kind == RECORD_BATCH:
            rows.append(n)
            offsets.append(pos)
            lengths.append(end - pos)
        pos = end
    d.update(row_group_rows=rows, row_group_offsets=offsets, row_group_bytes=lengths)
    return schema, d


def _walk_file(f: Any, url: str, size: int) -> tuple[pa.Schema, dict[str, Any]]:
    """The file format: its footer lists where the dictionary and record batches are (not
    every writer puts a schema message or an end-of-stream marker before it: polars does
    not); pyarrow's file reader reads the schema from it."""
    footer_at = _footer_start(f, url, size)
    f.seek(footer_at)
    tail = f.read(size - footer_at)  # the footer, its length and ARROW1
    footer = tail[:-10]
    # pyarrow's file reader reads only the magic and the tail to open a file: given them
    # alone, it reads the schema from the footer without asking the storage again
    schema = pa.ipc.open_file(pa.py_buffer(FILE_MAGIC + b"\0\0" + tail)).schema
    d: dict[str, Any] = {"ipc": "file", "ipc_footer": [footer_at, size - footer_at]}
    d["ipc_dictionaries"] = [
        [a, end - a, 0, ident, int(delta)]
        for a, end, _, ident, delta in _blocks(f, footer, 2, DICTIONARY, footer_at)
    ]
    batches = _blocks(f, footer, 3, RECORD_BATCH, footer_at)
    d["row_group_rows"] = [n for _, _, n, _, _ in batches]
    d["row_group_offsets"] = [a for a, _, _, _, _ in batches]
    d["row_group_bytes"] = [end - a for a, end, _, _, _ in batches]
    return schema, d


def _blocks(
    f: Any, footer: bytes, index: int, kind: int, limit: int
) -> list[tuple[int, int, int, int, bool]]:
    """(offset, end, rows, dictionary id, is delta) of each message the footer's vector
    `index` (Footer: dictionaries 2, recordBatches 3) lists, each read and checked to be a
    message of `kind` within the file's messages."""
    root = _table(footer, struct.unpack_from("<I", footer, 0)[0])
    at = _field(footer, root, index)
    if at is None:
        return []
    vector = at + struct.unpack_from("<I", footer, at)[0]
    out = []
    for i in range(struct.unpack_from("<I", footer, vector)[0]):
        # Block: offset (int64), metaDataLength (int32, 4 bytes padding), bodyLength (int64)
        offset, meta, body = struct.unpack_from("<qi4xq", footer, vector + 4 + 24 * i)
        message = _message(f, offset, limit) if 8 <= offset < limit else None
        if message is None or message[0] != kind or message[1] > offset + meta + body:
            raise EOFError(f"the footer lists a message at byte {offset} that is not there")
        out.append((offset, message[1], message[2], message[3], message[4]))
    return out


def _footer_start(f: Any, url: str, size: int) -> int:
    """Where the file format's footer begins (its length and ARROW1 end the file)."""
    f.seek(max(0, size - 10))
    tail = f.read(10)
    length = struct.unpack_from("<i", tail, 0)[0] if len(tail) == 10 else -1
    if tail[4:] != FILE_MAGIC or not 0 < length <= size - 18:
        raise ShardError(
            f"{redact(url)}: not a readable Arrow IPC file (it starts as the file format, "
            "but does not end with its footer and ARROW1: truncated?)"
        )
    return size - 10 - length


def framed(metadata: bytes) -> bytes:
    """A message's metadata framed as a stream holds it (continuation and length)."""
    return struct.pack("<Ii", CONTINUATION, len(metadata)) + metadata


def dictionaries_for(details: dict[str, Any], first: int, last: int) -> list[list[int]]:
    """The dictionary messages a reader replays to decode record batches first..last of a
    shard, in file order: for each dictionary id, its last full (non-delta) batch before
    `first` and the deltas after it, then every dictionary message up to `last`."""
    out: list[list[int]] = []
    latest: dict[int, list[list[int]]] = {}
    for d in details.get("ipc_dictionaries", ()):
        before, ident, delta = d[2], d[3], d[4]
        if before > last:
            break
        if before <= first:
            latest[ident] = [*latest.get(ident, []), d] if delta else [d]
        else:
            out.append(d)
    kept = sorted((d for ds in latest.values() for d in ds), key=lambda d: d[0])
    return kept + out
