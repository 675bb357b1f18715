"""Arrow IPC shards (``.arrow``, ``.feather``, ``.ipc``): the file format (pyarrow's
``ipc.new_file``, Feather v2) and the stream format (``ipc.new_stream``; what HF
``datasets``' ``save_to_disk`` writes), read by record batch as Parquet is read by row
group; and Feather version 1 files, read whole (loader.formats.arrow.feather_v1).

Indexing walks the message frames (loader.formats.arrow.frames). A read fetches the bytes of
its record batches (one range) and of the dictionary batches they need, checks that each
frame is where the index says with the size it says (bytes from the wrong place are a
ShardError, never rows), and hands them to pyarrow's readers: the stream format's, after
the file's own schema message, as a stream to ``ipc.open_stream``; the file format's, with
its footer, as a file of the fetched parts to ``ipc.open_file``. pyarrow converts
big-endian files to native byte order, replays dictionaries (deltas, replacements, shared
ones) and decompresses bodies. Every column is then validated in full (offsets, sizes,
UTF-8) before any Python code touches its buffers: the bytes are untrusted. Columns are
read as their values (loader.formats.arrow.values): dictionaries decoded, views and run-end
encoding undone.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ...errors import ShardError
from ...shard import Shard
from ...storage.filesystems import FileEntry, redact
from ...storage.ranges import PartsFile, RangeFile
from ...storage.retry import read_ranges
from ..parquet.fetch import Fetched, exact_fetcher, read_errors
from ..parquet.format import ParquetFormat
from ..parquet.meta import FooterCache, row_groups, schema_to_b64
from ..selected import pick, stored_rows
from .feather_v1 import (
    FEATHER_V1,
    batches_of,
    details_of,
    fetch_whole,
    is_feather_v1,
    read_v1,
)
from .frames import (
    CONTINUATION,
    DICTIONARY,
    RECORD_BATCH,
    SCHEMA,
    dictionaries_for,
    message_header,
    walk,
)
from .values import check_column, plain_column, schema_read_types

__all__ = ["ArrowFormat"]

_HEADER_READ = 64 << 10  # bytes read at each message header the walk reaches
_OPTIONS = pa.ipc.IpcReadOptions(ensure_native_endian=True, use_threads=False)
_EOS = struct.pack("<Ii", CONTINUATION, 0)

# each shard's head, read once a process: the stream format's schema message (its bytes:
# the file's byte order and dictionary ids, which a schema serialized again would not
# keep), the file format's footer
HEADS: FooterCache[bytes] = FooterCache(16 << 20)


class ArrowFormat(ParquetFormat):
    """Arrow IPC shards. Everything after the bytes (casting to the dataset's schema,
    kinds, blocks, batches) is ParquetFormat's: record batches are its row groups."""

    name = "arrow"
    suffixes = (".arrow", ".feather", ".ipc")

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """Each file's message frames walked (loader.formats.arrow.frames), of its listed
        version."""
        out = []
        for e in entries:
            f = RangeFile(fs, e.url, e.size, self.retry, e.version)
            f.readahead(_HEADER_READ)
            if is_feather_v1(f.read(4)):  # read whole: loader.formats.arrow.feather_v1
                table = read_v1(fetch_whole(fs, e.url, e.size, e.version, self.retry), e.url)
                schema, details = table.schema, details_of(e, table)
            else:
                schema, details = walk(f, e.url, e.size)
            plain = schema_read_types(schema.remove_metadata())
            out.append(
                {
                    "num_records": int(sum(details["row_group_rows"])),
                    "details": details,
                    "schema": schema_to_b64(plain),
                }
            )
        return out

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
        chunks: bool = True,
    ) -> list[Fetched]:
        """The bytes of the record batches holding each row range (one range read each),
        of the dictionary batches they need, and of the shard's head (`HEADS`) when this
        process has not read it yet: all in one concurrent read (`chunks` is Parquet's:
        Arrow IPC shards are always read so)."""
        names, cols = self._names(columns)
        d = shard.details
        if d.get("ipc") == FEATHER_V1:
            return self._fetch_v1(fs, shard, rows, names, cols)
        if d.get("ipc") not in ("file", "stream"):
            raise ShardError(
                f"{redact(shard.url)}: the index was built by an older shardstream, which did "
                "not record where the Arrow IPC schema and dictionaries are; rebuild the index"
            )
        key = (shard.url, shard.bytes, shard.version)
        wanted: list[tuple[Fetched | None, int, int]] = []  # (for, start, end); None: the head
        got = []
        for start, stop in rows:
            first_row, groups = row_groups(shard, start, stop)
            x = Fetched(shard, start, stop, first_row, groups, names, cols)
            x.parts = {}
            got.append(x)
            a, last = d["row_group_offsets"][groups[0]], groups[-1]
            wanted.append((x, a, d["row_group_offsets"][last] + d["row_group_bytes"][last]))
            for at, n, *_ in _dictionaries(d, groups):
                wanted.append((x, at, at + n))
        if HEADS.get(key) is None:
            at, n = _head(d)
            wanted.append((None, at, at + n))
        indexed = [(shard.bytes, shard.version)] * len(wanted)
        with read_errors(shard.url, sorted({g for x in got for g in x.groups})):
            data = read_ranges(
                fs,
                [shard.url] * len(wanted),
                [w[1] for w in wanted],
                [w[2] for w in wanted],
                self.retry,
                indexed,
            )
        for (into, a, _), blob in zip(wanted, data):
            if into is None:
                _check_head(blob, shard.url, d)
                HEADS.put(key, blob, len(blob))
            elif into.parts is not None:
                into.parts[(a, a + len(blob))] = blob
        return got

    def _fetch_v1(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        names: list[str] | None,
        cols: list[str] | None,
    ) -> list[Fetched]:
        """A Feather version 1 shard's bytes, all of them (its rows cannot be read by range:
        loader.formats.arrow.feather_v1), read once for all the row ranges."""
        got = []
        for start, stop in rows:
            first_row, groups = row_groups(shard, start, stop)
            got.append(Fetched(shard, start, stop, first_row, groups, names, cols))
        with read_errors(shard.url, sorted({g for x in got for g in x.groups})):
            blob = fetch_whole(fs, shard.url, shard.bytes, shard.version, self.retry)
        for x in got:
            x.parts = {(0, shard.bytes): blob}
        return got

    def decode(
        self,
        fs: Any,
        got: Fetched,
        table: pa.Table | None = None,
        failed: BaseException | None = None,
    ) -> pa.Table:
        """The fetched batches, each frame checked against the index, read by pyarrow's
        readers (with the dictionaries they need), validated in full, as one table of the
        index's schema. (`table`, `failed`: Parquet's reads ahead only; never given here.)"""
        if table is not None or failed is not None:
            raise ValueError("Arrow IPC shards are not read ahead (loader.read.readahead)")
        shard, d = got.shard, got.shard.details
        number = d.get("schema", 0)
        if number >= len(self.file_schemas):
            raise ValueError("ArrowFormat reads with the index's schemas (file_schemas)")
        if d["ipc"] == FEATHER_V1:
            table = self._decode_v1(got, self.file_schemas[number])
        else:
            table = self._decode_ipc(fs, got, self.file_schemas[number])
        if got.cols is not None:
            table = table.select(got.cols)
        part = pick(table, d, got.groups, got.start - got.first_row, got.stop - got.first_row)
        return self._shape(part, shard, got.names)

    def _decode_v1(self, got: Fetched, want: pa.Schema) -> pa.Table:
        """A Feather version 1 shard's table, from its whole bytes, by pyarrow's reader."""
        shard = got.shard
        blob = (got.parts or {}).get((0, shard.bytes))
        if blob is None:
            raise ShardError(f"{redact(shard.url)}: the Feather version 1 file was not fetched")
        with read_errors(shard.url, got.groups):
            raw = read_v1(blob, shard.url)
            rows = sum(stored_rows(shard.details))
            if raw.num_rows != rows:
                raise ShardError(
                    f"{redact(shard.url)}: a Feather version 1 file of {raw.num_rows} rows, the "
                    f"index recorded {rows}: the shard changed; rebuild the index"
                )
            return _plain_table(batches_of(raw), raw.schema, want, shard.url)

    def _decode_ipc(self, fs: Any, got: Fetched, want: pa.Schema) -> pa.Table:
        """The fetched record batches (and their dictionaries) as one table, by pyarrow's
        IPC readers."""
        shard, d = got.shard, got.shard.details
        key = (shard.url, shard.bytes, shard.version)
        head = HEADS.get(key)
        if head is None:  # dropped from the cache since the fetch: fetch it again
            at, n = _head(d)
            indexed = [(shard.bytes, shard.version)]
            (head,) = read_ranges(fs, [shard.url], [at], [at + n], self.retry, indexed)
            _check_head(head, shard.url, d)
        parts = dict(got.parts or {})
        frames = []  # (offset, frame) in file order
        for g in got.groups:
            at, n = d["row_group_offsets"][g], d["row_group_bytes"][g]
            frame = _part(parts, at, n, shard.url)
            _check_frame(frame, shard.url, at, n, RECORD_BATCH, stored_rows(d)[g])
            frames.append((at, frame))
        for at, n, *_ in _dictionaries(d, got.groups):
            frame = _part(parts, at, n, shard.url)
            _check_frame(frame, shard.url, at, n, DICTIONARY, None)
            frames.append((at, frame))
        with read_errors(shard.url, got.groups):
            if d["ipc"] == "stream":  # the file's schema, then its messages in file order
                stream = b"".join([head, *(f for _, f in sorted(frames)), _EOS])
                reader = pa.ipc.open_stream(pa.py_buffer(stream), options=_OPTIONS)
                batches, schema = list(reader), reader.schema
            else:  # pyarrow's file reader, on the fetched parts and the footer
                footer_at = d["ipc_footer"][0]
                parts[(footer_at, footer_at + len(head))] = head
                f = PartsFile(shard.url, shard.bytes, parts, exact_fetcher(fs, shard, self.retry))
                reader = pa.ipc.open_file(f, options=_OPTIONS)
                batches, schema = [reader.get_batch(g) for g in got.groups], reader.schema
            return _plain_table(batches, schema, want, shard.url)


def _head(d: dict[str, Any]) -> tuple[int, int]:
    """[offset, bytes] of a shard's head: the schema message, or the footer."""
    at, n = d["ipc_schema"] if d["ipc"] == "stream" else d["ipc_footer"]
    return int(at), int(n)


def _check_head(blob: bytes, url: str, d: dict[str, Any]) -> None:
    at, n = _head(d)
    if d["ipc"] == "stream":
        _check_frame(blob, url, at, n, SCHEMA, None)
    elif len(blob) != n or blob[-6:] != b"ARROW1":
        raise ShardError(
            f"{redact(url)}: the bytes read at {at} are not the Arrow IPC footer the index "
            "recorded: the shard changed, or the storage returned other bytes; rebuild the index"
        )


def _dictionaries(d: dict[str, Any], groups: Sequence[int]) -> list[list[int]]:
    """The dictionary batches a read of record batches `groups` needs: the stream
    format's replayed up to them (`dictionaries_for`); the file format's, all (pyarrow's
    file reader reads every one before its first batch)."""
    if d["ipc"] == "stream":
        return dictionaries_for(d, groups[0], groups[-1])
    return list(d.get("ipc_dictionaries", ()))


def _plain_table(
    batches: list[pa.RecordBatch], read: pa.Schema, indexed: pa.Schema, url: str
) -> pa.Table:
    """The batches as a table of the index's schema, every column validated in full (the
    bytes are untrusted: before anything reads them) and read as its values."""
    if [f.name for f in read] != indexed.names:
        raise ShardError(
            f"{redact(url)}: the file's columns are {read.names}, the index recorded "
            f"{indexed.names}; rebuild the index"
        )
    columns = []
    for i, field in enumerate(indexed):
        chunks = []
        try:
            for b in batches:
                column = b.column(i)
                check_column(column)
                chunks.append(plain_column(column))
        except KeyError as e:  # a type pyarrow reads but has no Python array class for
            raise ShardError(
                f"{redact(url)}: column {field.name!r} is {read.field(i).type}, which pyarrow "
                "reads but cannot hand to Python; ask for other columns (columns=[...])"
            ) from e
        except (pa.ArrowException, ValueError, TypeError) as e:
            raise ShardError(
                f"{redact(url)}: column {field.name!r} ({read.field(i).type}) cannot be read: {e}"
            ) from e
        if any(not c.type.equals(field.type) for c in chunks):
            raise ShardError(
                f"{redact(url)}: column {field.name!r} reads as {chunks[0].type}, the index "
                f"recorded {field.type}; rebuild the index"
            )
        columns.append(pa.chunked_array(chunks, type=field.type))
    return pa.Table.from_arrays(columns, schema=indexed)


def _part(parts: dict[tuple[int, int], bytes], at: int, n: int, url: str) -> memoryview:
    """Bytes [at, at + n) from the fetched ranges holding them."""
    for (a, b), blob in parts.items():
        if a <= at and at + n <= b:
            return memoryview(blob)[at - a : at - a + n]
    raise ShardError(f"{redact(url)}: bytes [{at}, {at + n}) were not fetched")


def _check_frame(frame: Any, url: str, offset: int, size: int, kind: int, rows: int | None) -> None:
    """The bytes at `offset` must be the message the index recorded: a framed message of
    `kind`, of `size` bytes, holding `rows` rows (a record batch's)."""
    names = {SCHEMA: "schema", DICTIONARY: "dictionary batch", RECORD_BATCH: "record batch"}
    try:
        first = struct.unpack_from("<I", frame, 0)[0]
        prefix = 8 if first == CONTINUATION else 4
        length = struct.unpack_from("<i", frame, prefix - 4)[0]
        got_kind, body, n, _, _ = message_header(bytes(frame[prefix : prefix + length]))
        ok = got_kind == kind and prefix + length + body <= size and len(frame) == size
        ok = ok and (rows is None or n == rows)
    except (struct.error, IndexError, ValueError):
        ok = False
    if not ok:
        what = f"{rows} rows, " if rows is not None else ""
        raise ShardError(
            f"{redact(url)}: the bytes read at {offset} are not the {names[kind]} the index "
            f"recorded ({what}{size} bytes): the shard changed, or the storage returned "
            "other bytes; rebuild the index"
        )
