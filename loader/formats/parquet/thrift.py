"""The one fact about a Parquet footer that pyarrow cannot tell us safely: whether any
column chunk carries encryption metadata (Parquet modular encryption, PARQUET-1178).

A footer whose column chunks hold ``crypto_metadata`` parses (``pq.read_metadata``), but
asking pyarrow (26) for such a column's metadata without keys throws a C++ exception
through a function that cannot pass it on: the process aborts ("Cannot decrypt
ColumnMetadata", std::terminate), where ``pq.read_table`` raises an OSError. Files with
columns encrypted under a plaintext footer are such footers; so are damaged ones (the
arrow-testing fuzz case ``dictbitwidth-5882232959270912``). A training job must not die on
a file, so before touching any column we walk the footer's Thrift compact encoding:
FileMetaData.row_groups (field 4), each RowGroup's columns (field 1), each ColumnChunk's
``crypto_metadata`` (field 8), skipping every other value, and the footer's own
``encryption_algorithm`` (FileMetaData field 8).

The walk is plain functions over the bytes, scalars skipped inline: ~0.09 µs a footer
byte (0.9 ms for the 9 KB footer of 20 row groups of 4 columns, 42 ms for 535 KB), about
as much as pyarrow's accessors take for the index details. It is the price of indexing a
file without risking the process; an index is built once (saved, or split over ranks).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["encrypted_columns"]

_ROW_GROUPS, _ENCRYPTION_ALGORITHM = 4, 8  # FileMetaData fields (parquet.thrift)
_COLUMNS = 1  # RowGroup.columns
_CRYPTO_METADATA = 8  # ColumnChunk.crypto_metadata

# compact protocol types
_BYTE, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = 3, 7, 8, 9, 10, 11, 12


def _varint(d: bytes, at: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = d[at]
        at += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, at
        shift += 7


def _list_head(d: bytes, at: int) -> tuple[int, int, int]:
    """(items, item type, position of the first item) of a list or set."""
    head = d[at]
    n, item = head >> 4, head & 0x0F
    if n == 15:
        n, at = _varint(d, at + 1)
        return n, item, at
    return n, item, at + 1


def _field(d: bytes, at: int, last: int) -> tuple[int, int, int]:
    """(field id, type, position of the value) of the field header at `at`; (0, 0, ...)
    at the struct's end."""
    head = d[at]
    delta, kind = head >> 4, head & 0x0F
    if kind == 0:  # STOP, whatever the high bits hold (as Thrift's own reader takes it)
        return 0, 0, at + 1
    if delta:
        return last + delta, kind, at + 1
    z, at = _varint(d, at + 1)
    return (z >> 1) ^ -(z & 1), kind, at


def _skip(d: bytes, at: int, kind: int) -> int:
    """The position after a value of compact type `kind` at `at`."""
    if kind <= 2:  # a struct field's bool is in its header
        return at
    if kind == _BYTE:
        return at + 1
    if kind < _DOUBLE:  # i16, i32, i64: varints
        while d[at] & 0x80:
            at += 1
        return at + 1
    if kind == _DOUBLE:
        return at + 8
    if kind == _BINARY:
        n, at = _varint(d, at)
        return at + n
    if kind in (_LIST, _SET):
        n, item, at = _list_head(d, at)
        if item <= 2:  # a list's bools take a byte each
            return at + n
        if 4 <= item <= 6:  # varints: n bytes without the continuation bit
            while n:
                if d[at] < 0x80:
                    n -= 1
                at += 1
            return at
        if item == _BINARY:
            for _ in range(n):
                size, at = _varint(d, at)
                at += size
            return at
        for _ in range(n):
            at = _skip(d, at, item)
        return at
    if kind == _MAP:
        n, at = _varint(d, at)
        if n:
            types = d[at]
            at += 1
            for _ in range(n):
                at = _skip(d, _skip(d, at, types >> 4), types & 0x0F)
        return at
    if kind == _STRUCT:  # the hot loop: scalars skipped inline, no call per field
        while True:
            head = d[at]
            at += 1
            kind = head & 0x0F
            if not kind:
                return at
            if not head & 0xF0:  # a long field header: its id, a zigzag varint
                while d[at] & 0x80:
                    at += 1
                at += 1
            if 4 <= kind <= 6:  # i16, i32, i64
                while d[at] & 0x80:
                    at += 1
                at += 1
            elif kind == _BINARY:
                n, at = _varint(d, at)
                at += n
            elif kind > 2:
                at = _skip(d, at, kind)
    raise ValueError(f"unknown Thrift compact type {kind}")


def _struct_fields(
    d: bytes, at: int, visit: dict[int, Callable[[bytes, int], int]]
) -> tuple[int, set[int]]:
    """Walk a struct at `at`: fields in `visit` are handed to their function (which
    returns the position after the value), others skipped. Returns (end, field ids)."""
    seen: set[int] = set()
    field = 0
    while True:
        field, kind, at = _field(d, at, field)
        if not kind:
            return at, seen
        seen.add(field)
        f = visit.get(field)
        at = f(d, at) if f is not None and kind in (_LIST, _STRUCT) else _skip(d, at, kind)


def encrypted_columns(metadata: bytes) -> bool:
    """True when a footer's FileMetaData (its Thrift bytes, without length and magic)
    declares an encryption algorithm or any column chunk holds encryption metadata.
    Raises ValueError when the bytes are not a Thrift struct this walk can follow (a
    damaged footer: pyarrow may still parse a prefix of it)."""
    found = []

    def column(d: bytes, at: int) -> int:
        end, seen = _struct_fields(d, at, {})
        if _CRYPTO_METADATA in seen:
            found.append(True)
        return end

    def columns(d: bytes, at: int) -> int:
        n, item, at = _list_head(d, at)
        for _ in range(n):
            at = column(d, at) if item == _STRUCT else _skip(d, at, item)
        return at

    def row_groups(d: bytes, at: int) -> int:
        n, item, at = _list_head(d, at)
        for _ in range(n):
            if item == _STRUCT:
                at, _ = _struct_fields(d, at, {_COLUMNS: columns})
            else:
                at = _skip(d, at, item)
        return at

    try:
        _, seen = _struct_fields(metadata, 0, {_ROW_GROUPS: row_groups})
    except (IndexError, ValueError, RecursionError) as e:
        if found:
            return True
        raise ValueError(f"the footer's Thrift encoding does not parse ({e!r})") from e
    return bool(found) or _ENCRYPTION_ALGORITHM in seen
