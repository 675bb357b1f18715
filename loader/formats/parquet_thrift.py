"""The one fact about a Parquet footer that pyarrow cannot tell us safely: whether its
columns are encrypted (Parquet modular encryption, PARQUET-1178).

A file with encrypted columns under a plaintext footer parses (``pq.read_metadata``),
but asking pyarrow (26) for an encrypted column's metadata without keys throws a C++
exception through a function that cannot pass it on: the process aborts ("Cannot decrypt
ColumnMetadata", std::terminate), where ``pq.read_table`` raises an OSError. A training
job must not die on a file, so before touching any column we look for the footer's
``encryption_algorithm`` (FileMetaData field 8, set in exactly these files) by walking
the top level of its Thrift compact encoding, skipping every value.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["encrypted_columns"]

_ENCRYPTION_ALGORITHM = 8  # FileMetaData.encryption_algorithm (parquet.thrift)

# compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        b = self.data[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def skip(self, kind: int) -> None:
        if kind in (_TRUE, _FALSE):
            return  # a struct field's bool is in its header (a list's: see _skip_list)
        if kind == _BYTE:
            self.at += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.at += 8
        elif kind == _BINARY:
            n = self.varint()
            self.at += n
        elif kind in (_LIST, _SET):
            head = self.byte()
            n, item = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            for _ in range(n):
                if item in (_TRUE, _FALSE):
                    self.at += 1
                else:
                    self.skip(item)
        elif kind == _MAP:
            n = self.varint()
            if n:
                types = self.byte()
                for _ in range(n):
                    self.skip(types >> 4)
                    self.skip(types & 0x0F)
        elif kind == _STRUCT:
            for _ in self.fields():
                pass
        else:
            raise ValueError(f"unknown Thrift compact type {kind}")

    def fields(self) -> Iterator[int]:
        """The ids of a struct's fields, each value skipped after it is yielded."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            if delta:
                field = last + delta
            else:
                z = self.varint()
                field = (z >> 1) ^ -(z & 1)
            last = field
            yield field
            self.skip(kind)


def encrypted_columns(metadata: bytes) -> bool:
    """True when a footer's FileMetaData (its Thrift bytes, without length and magic)
    declares an encryption algorithm: columns encrypted under a plaintext footer. A footer
    this walk cannot parse is left to pyarrow (which names the damage)."""
    try:
        return any(f == _ENCRYPTION_ALGORITHM for f in _Reader(metadata).fields())
    except (IndexError, ValueError):
        return False
