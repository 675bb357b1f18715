"""Indexing a tar shard: its members' byte ranges from one pass over the headers
(sequential, or one small read a header skipping the bodies), grouped into webdataset
samples by loader.formats.tar.groups; and the header checks a read makes of the bytes it
got."""

from __future__ import annotations

import gzip
import tarfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.implementations.local import LocalFileSystem

from ...columns.arrays import flags
from ...errors import ShardError
from ...storage.filesystems import redact
from ...storage.ranges import RangeFile
from .groups import POOL, Found, Member, group_members

__all__ = [
    "BLOCK",
    "LOCAL_CROSSOVER",
    "REMOTE_CROSSOVER",
    "check_headers",
    "choose_ranged",
    "crossover_for",
    "group_members",
    "scan_file",
    "scan_tar",
]

_SCANBLOCK = 1 << 20  # readahead while walking the headers
# a ranged header read: the header and what follows it, so a small member after a large
# one (a .cls after a .jpg) and the next header usually come with it in one request
_PEEK = 8 << 10
BLOCK = tarfile.BLOCKSIZE  # 512: a header; two zero blocks end an archive


def scan_tar(
    f: Any,
    url: str,
    size: int | None,
    mark: Callable[[], int] | None = None,
    crossover: int | None = None,
) -> dict[str, Any]:
    """Index an open tar file: per record its key and members [ext, data offset, size].

    Members with the same key next to each other form one record, as webdataset's
    group_by_keys does; a record holding two members with one extension is refused, as
    webdataset refuses it ("duplicate file name in tar file"). A tar cut short raises
    ShardError rather than losing its tail: inside a member, or between members (Python's
    tarfile then simply stops, so we check for the end-of-archive block ourselves).

    Headers are read sequentially (1 MiB at a time, member bodies included) or, with a
    `crossover`, after the first 1 MiB one small read at each header, skipping the bodies,
    when the members of that first 1 MiB lie `crossover` bytes apart or more on average
    (`choose_ranged`; 0: ranged from the start). Both give the same index.

    For a compressed tar, `f` is the decompressed stream (`size` None: unknown) and `mark()`
    tells how many compressed bytes were read so far: each record's ``compressed_ends``
    entry bounds the bytes a reader must decompress to reach its last member's end.
    """
    try:
        found, end, closed = _walk_headers(f, url, mark, crossover)
    except _NeedsTarfile:
        _readahead(f, None)  # tarfile reads a header at a time
        found, end, closed = _tarfile_members(f, url, mark)
    keys, members, ends = group_members(found, url, size)
    if not closed:
        f.seek(end)
        closed = f.read(BLOCK) == bytes(BLOCK)
    if not closed:
        where = f"of {size}" if size is not None else "of the decompressed stream"
        raise ShardError(
            f"{redact(url)}: truncated tar: no end-of-archive block after byte {end} "
            f"{where}; the file was cut short (re-upload it)"
        )
    details: dict[str, Any] = {"keys": keys, "members": members}
    if mark is not None:
        details["compressed_ends"] = ends
    return {"num_records": len(keys), "details": details}


def _tarfile_members(f: Any, url: str, mark: Callable[[], int] | None) -> tuple[Found, int, bool]:
    """(regular members, offset of the block after the last, False: the end-of-archive
    block is still to be checked) by Python's tarfile: any header format (pax, GNU long
    names, base-256 sizes, ...)."""
    found: list[Member] = []
    f.seek(0)
    try:
        with tarfile.open(fileobj=f, mode="r:") as tf:
            for info in tf:
                if info.sparse is not None:  # GNU sparse (tar --sparse): holes not stored
                    raise ShardError(
                        f"{redact(url)}: member {info.name} is a GNU sparse file (tar "
                        "--sparse): its stored bytes are not its contents; repack the shard "
                        "without --sparse"
                    )
                if info.isreg():
                    seen = mark() if mark else 0
                    found.append((info.name, info.offset_data, info.size, seen))
            end = tf.offset  # where the next header would start
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ShardError(f"{redact(url)}: corrupt or truncated tar ({e})") from e
    return _compressed_ends(Found.of_members(found), mark), end, False


def _compressed_ends(found: Found, mark: Callable[[], int] | None) -> Found:
    """Member i's data lies before member i+1's header, so the compressed bytes read when
    that header was seen (or at the end) are enough to decompress it."""
    if mark is None:
        return found
    seen = np.append(found.seen[1:], mark()).astype(np.int64)
    return Found(found.names, found.offsets, found.sizes, seen)


class _NeedsTarfile(Exception):
    """A header our walk leaves to tarfile."""


_DATA = (ord("0"), ord("7"))  # tarfile's REGTYPE, CONTTYPE (AREGTYPE, NUL: see the walk)
_NO_DATA = tuple(map(ord, "123456"))  # links, devices, directories, fifos: no data
_ZERO = bytes(BLOCK)
_FIELD_END = (0, 32)  # NUL, space


def choose_ranged(walked: int, members: int, crossover: int | None) -> bool:
    """Whether to read the rest of a tar's headers one small read at a time: when its
    first members (`members` of them in its first `walked` bytes) lie `crossover` bytes
    apart or more on average. A body skipped saves its bytes, a header read costs a
    request: ranged reads win where one request costs less than reading `crossover`
    bytes (measured by scripts.bench.index; see LOCAL_CROSSOVER, REMOTE_CROSSOVER)."""
    if crossover is None:
        return False
    return walked >= crossover * max(1, members)


def _walk_headers(
    f: Any,
    url: str,
    mark: Callable[[], int] | None = None,
    crossover: int | None = None,
) -> tuple[Found, int, bool]:
    """What `_tarfile_members` returns (True when the end-of-archive block was seen), for
    plain ustar/GNU/v7 headers only (what tar writers emit for short ASCII names); raises
    _NeedsTarfile on any other header.

    tarfile costs ~30 us a member (a TarInfo object, its checks); WebDataset shards hold
    many small members. The walk itself reads only what moves it on (the type flag and
    the size) from each header; the names and checksums of a buffer's headers are read
    and checked for all of them at once (`_buffer_done`), as tarfile checks them (unsigned
    sums, signed where those differ).

    Reads: 1 MiB at a time; with `crossover` (see `choose_ranged`), after the first 1 MiB
    (at once when 0) one `_PEEK`-byte read at each header the buffer does not hold,
    skipping the member bodies between them.
    """
    names: list[pa.Array | list[str] | None] = []  # each buffer's member names
    offsets: list[int] = []
    sizes: list[int] = []
    seen: list[int] = []
    pos, base, buf = 0, 0, b""
    others: list[int] = []  # offsets in buf of the headers of no data (checked too)
    first = 0  # the buffer's first member in `offsets`
    step, decided = max(_SCANBLOCK, BLOCK), crossover is None
    if crossover == 0:
        step, decided = _ranged(f), True
    elif not decided:
        _readahead(f, 0)  # the first 1 MiB exactly: the choice may skip what follows
    while True:
        if pos + BLOCK > base + len(buf):
            names.append(_buffer_done(buf, others, offsets[first:], base, url))
            others, first = [], len(offsets)
            if not decided and buf:  # the first buffer is walked: choose for the rest
                decided = True
                if choose_ranged(pos, len(offsets), crossover):
                    step = _ranged(f)
                else:
                    _readahead(f, None)
            try:
                f.seek(pos)
                base, buf = pos, f.read(step)
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise ShardError(f"{redact(url)}: corrupt or truncated archive ({e})") from e
            if len(buf) < BLOCK:
                # no room for a header: the end check reports it
                found = _found(names, offsets, sizes, seen)
                return _compressed_ends(found, mark), pos, False
        at = pos - base
        if buf[at] == 0 and buf[at : at + BLOCK] == _ZERO:  # the end-of-archive block
            names.append(_buffer_done(buf, others, offsets[first:], base, url))
            return _compressed_ends(_found(names, offsets, sizes, seen), mark), pos, True
        kind = buf[at + 156]
        if buf[at + 124] & 0x80:
            raise _NeedsTarfile  # a base-256 size
        pos += BLOCK
        if kind == 0:  # AREGTYPE: a directory if its name ends with a slash (tarfile)
            if _name(buf[at : at + BLOCK]).endswith(b"/"):
                others.append(at)
                continue
        elif kind in _NO_DATA:
            others.append(at)
            continue  # tarfile skips no data after these
        elif kind not in _DATA:
            raise _NeedsTarfile  # pax / GNU long name / sparse / vendor
        try:  # the usual size field: 11 octal digits, then NUL or space
            if buf[at + 135] not in _FIELD_END:
                raise ValueError
            length = int(buf[at + 124 : at + 135], 8)
        except ValueError:
            length = _size(buf, at, base, url)
        offsets.append(pos)
        sizes.append(length)
        if mark is not None:
            seen.append(mark())
        pos += -(-length // BLOCK) * BLOCK


def _size(buf: bytes, at: int, base: int, url: str) -> int:
    """The size field of the header at `at`, as tarfile's ``nti`` reads it."""
    field = buf[at + 124 : at + 136]
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ShardError(
            f"{redact(url)}: corrupt or truncated tar (bad header at byte {base + at})"
        ) from None


def _name(hdr: bytes) -> bytes:
    """A header's name as tarfile reads it: up to the first NUL, after ustar's prefix."""
    name = hdr[:100].split(b"\0", 1)[0]
    prefix = hdr[345:500].split(b"\0", 1)[0]  # ustar's; tarfile reads it in any header
    return prefix + b"/" + name if prefix else name


def _buffer_done(
    buf: bytes, others: list[int], members: list[int], base: int, url: str
) -> pa.Array | list[str] | None:
    """Check the checksums of the headers in `buf` (at `others`, and before the data of
    `members`, offsets in the file); the members' names (Arrow strings; str with
    surrogate escapes where not UTF-8, as tarfile decodes them)."""
    mine_at = np.array(members, dtype=np.int64) - BLOCK - base
    at = np.sort(np.concatenate((mine_at, others))) if others else mine_at
    if not at.size:
        return None
    rows = _rows(buf, at)
    _check_sums(rows, _octal(rows[:, 148:156]), at, base, url)
    if not members:
        return None
    mine = rows[np.searchsorted(at, mine_at)] if others else rows
    values: Any = np.ascontiguousarray(mine[:, :100]).view("S100").ravel()
    arr = pa.array(values, pa.binary(), memory_pool=POOL)  # numpy drops the trailing NULs
    # tarfile cuts a name at its first NUL, and puts ustar's prefix before it
    nul = flags(pc.match_substring(arr, "\0", memory_pool=POOL))
    odd = np.flatnonzero(nul | (mine[:, 345] != 0))
    if odd.size:
        values = arr.to_pylist()
        for i in odd.tolist():
            values[i] = _name(mine[i].tobytes())
        arr = pa.array(values, pa.binary(), memory_pool=POOL)
    try:
        return arr.cast(pa.string(), memory_pool=POOL)
    except pa.ArrowInvalid:
        return [v.decode("utf-8", "surrogateescape") for v in arr.to_pylist()]


def _found(
    names: list[pa.Array | list[str] | None], offsets: list[int], sizes: list[int], seen: list[int]
) -> Found:
    chunks = [c for c in names if c is not None]
    joined: pa.Array | list[str]
    if all(isinstance(c, pa.Array) for c in chunks):
        joined = pa.concat_arrays(chunks, memory_pool=POOL) if chunks else pa.array([], pa.string())
    else:
        joined = [n for c in chunks for n in (c if isinstance(c, list) else c.to_pylist())]
    cols = (np.array(c, dtype=np.int64) for c in (offsets, sizes, seen or [0] * len(offsets)))
    return Found(joined, *cols)


def _readahead(f: Any, nbytes: int | None) -> None:
    """Set a RangeFile's readahead (None: the one it was made with, `scan_file`)."""
    if isinstance(f, RangeFile):
        f.readahead(nbytes)


def _ranged(f: Any) -> int:
    """Switch `f` to reads without readahead (a RangeFile: one request per read) and give
    the size of a ranged header read."""
    _readahead(f, 0)
    return _PEEK


def _rows(buf: bytes, at: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """(n, 512) the header blocks at offsets `at` of `buf` (multiples of 512: headers start
    at multiples of 512 in the file, and `buf` at one too)."""
    blocks = np.frombuffer(buf, dtype=np.uint8, count=len(buf) // BLOCK * BLOCK)
    return blocks.reshape(-1, BLOCK)[at // BLOCK]


def _check_sums(
    rows: npt.NDArray[np.uint8],
    stored: npt.NDArray[np.int64],
    at: npt.NDArray[np.int64],
    base: int,
    url: str,
) -> None:
    # the checksum field counts as eight spaces
    unsigned = rows.sum(axis=1, dtype=np.uint32).astype(np.int64)
    unsigned -= rows[:, 148:156].sum(axis=1, dtype=np.int64) - 8 * 32
    for i in np.flatnonzero(unsigned != stored):  # rare: old writers summed signed bytes
        # (tarfile.calc_chksums does this too, but is not public API)
        signed = unsigned[i] - 256 * int((rows[i] > 127).sum() - (rows[i, 148:156] > 127).sum())
        if signed != stored[i]:
            raise ShardError(
                f"{redact(url)}: corrupt or truncated tar (bad header checksum at byte "
                f"{base + int(at[i])})"
            )


_PLACES = np.arange(8)
_SIX = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # six octal digits' place values


def _octal(fields: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """Octal number fields (n, 8) as tarfile's ``nti`` reads them (up to the first NUL,
    spaces around the digits), vectorized; -1 where a field is not one."""
    digits = fields[:, :6]
    if ((digits >= 48) & (digits <= 55)).all() and (fields[:, 6] == 0).all():
        return (digits.astype(np.int64) - 48) @ _SIX  # what writers put in a checksum
    zero = fields == 0
    nul = np.where(zero.any(axis=1), zero.argmax(axis=1), 8)
    live = _PLACES[None, :] < nul[:, None]
    digit = live & (fields >= 48) & (fields <= 55)
    ok = (live <= (digit | (fields == 32))).all(axis=1) & digit.any(axis=1)
    first, last = digit.argmax(axis=1), 7 - digit[:, ::-1].argmax(axis=1)
    ok &= digit.sum(axis=1) == last - first + 1  # one run of digits
    shift = 3 * np.clip(last[:, None] - _PLACES[None, :], 0, 7)
    value = np.where(digit, (fields.astype(np.int64) - 48) << shift, 0).sum(axis=1)
    return np.where(ok, value, -1)


def check_headers(data: bytes, lo: int, records: Sequence[Any], url: str) -> None:
    """The header block before each record's first member (and the last member read) in
    `data` (bytes [lo, ...) of the tar stream) must carry a valid checksum: bytes that are
    not the indexed members (a range answered from the wrong offset, zeros, another file)
    are a ShardError, never samples. Vectorized: ~0.5 us a record (every member's header:
    ~2 us a record of 4 members, 6% of the tar reader's CPU)."""
    if not records:
        return
    firsts = [ms[0][1] for ms in records]
    firsts.append(records[-1][-1][1])
    at = np.array(firsts, dtype=np.int64) - BLOCK - lo
    rows = _rows(data, at)
    stored = _octal(rows[:, 148:156])
    bad = np.flatnonzero(stored < 0)
    if bad.size:
        raise ShardError(
            f"{redact(url)}: the bytes read at {lo + int(at[bad[0]])} are not the tar header "
            "the index recorded (no checksum): the shard changed, or the storage returned "
            "other bytes; rebuild the index"
        )
    _check_sums(rows, stored, at, lo, url)


# Member spacing (bytes between headers) from which one small read per header beats
# reading the bodies: a small read's time x the sequential rate (scripts.bench.index
# --only crossover). Local files: 0.03 ms x 4.2 GB/s = 116 KiB (end to end, ranged reads
# win from 128 KiB members). S3: a round trip x a connection's rate: 6.5 ms x 110 MB/s =
# 700 KiB at a local moto server, 1.7 MB through a proxy adding 30 ms, 2-5 MB for S3's
# 20-50 ms first byte at 80-100 MB/s.
LOCAL_CROSSOVER = 128 << 10
REMOTE_CROSSOVER = 2 << 20


# An object store's tar walk reads 8 MiB ahead as 2 MiB ranged reads sent together: a
# 12 MiB shard of small members is 3 round trips in line, not ~7 (scripts.bench.cloud:
# 1 MiB pieces were more requests than they saved, 23k records/s against 28k). 16 shards
# at once: 128 MiB held. A read of records stays one request (split, -24% against moto).
REMOTE_SCAN = (8 << 20, 2 << 20)


def scan_file(fs: Any, url: str, size: int, retry: Any, version: str | None) -> RangeFile:
    """The file a tar scan walks: 1 MiB of readahead locally, `REMOTE_SCAN` elsewhere."""
    if isinstance(fs, LocalFileSystem):
        return RangeFile(fs, url, size, retry, version, readahead=_SCANBLOCK)
    block, piece = REMOTE_SCAN
    return RangeFile(fs, url, size, retry, version, readahead=block, piece=piece)


def crossover_for(fs: Any) -> int:
    """The member spacing from which header reads skip bodies on this filesystem."""
    return LOCAL_CROSSOVER if isinstance(fs, LocalFileSystem) else REMOTE_CROSSOVER
