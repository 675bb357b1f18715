"""Indexing a tar shard: its members' byte ranges grouped into webdataset samples, from
one pass over the headers (sequential, or one small read a header skipping the bodies),
and the header checks a read makes of the bytes it got."""

from __future__ import annotations

import gzip
import re
import tarfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from fsspec.implementations.local import LocalFileSystem

from ..errors import ShardError
from ..storage.filesystems import redact
from ..storage.ranges import RangeFile

__all__ = [
    "BLOCK",
    "LOCAL_CROSSOVER",
    "REMOTE_CROSSOVER",
    "check_headers",
    "choose_ranged",
    "crossover_for",
    "group_members",
    "scan_tar",
]

_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta default
# webdataset's base_plus_ext (key, then every extension), compiled once: it calls
# re.match with the pattern string, a cache lookup that was a third of the index time
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
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
        _readahead(f, _SCANBLOCK)  # tarfile reads a header at a time
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


def group_members(
    found: Sequence[Member], url: str, size: int | None
) -> tuple[list[str], list[list[list[Any]]], list[int]]:
    """(keys, members, compressed ends) of the records the tar's regular members form, by
    webdataset's rules: meta files (``__...__``) and names without an extension skipped,
    the key and lower-cased extension split as `base_plus_ext` splits them, neighbours
    with one key one record, a repeated extension in a record refused, and a key whose
    members are not all next to each other refused."""
    keys: list[str] = []
    members: list[list[list[Any]]] = []
    ends: list[int] = []
    exts: set[str] = set()  # the current record's extensions
    seen_keys: set[str] = set()
    for name, offset, length, seen in found:
        if name[:2] == "__" and _SKIP_META.match(name):
            continue
        split = _KEY_EXT.match(name)
        if split is None:
            continue
        key, ext = split.groups()
        ext = ext.lower()  # as webdataset's group_by_keys (lcase=True)
        if size is not None and offset + length > size:
            raise ShardError(
                f"{redact(url)}: truncated tar: member {name} ends at byte "
                f"{offset + length} of a {size}-byte file"
            )
        if not keys or keys[-1] != key:
            if key in seen_keys:
                raise ShardError(
                    f"{redact(url)}: sample {key!r} is split: its members are not next to "
                    f"each other in the tar ({name} comes after other samples' members); "
                    "webdataset would give two samples with this key. Write each sample's "
                    "files together (sort the names before tarring)"
                )
            seen_keys.add(key)
            keys.append(key)
            members.append([])
            ends.append(seen)
            exts = set()
        elif ext in exts:
            raise ShardError(
                f"{redact(url)}: duplicate file name in tar file: sample {key!r} has two "
                f"members with extension {ext!r} (the second: {name}); webdataset refuses "
                "such shards too"
            )
        exts.add(ext)
        members[-1].append([ext, offset, length])
        ends[-1] = seen
    return keys, members, ends


# name, data offset, data size, compressed bytes read once the member's data is reached
# (0 for an uncompressed tar)
Member = tuple[str, int, int, int]


def _tarfile_members(
    f: Any, url: str, mark: Callable[[], int] | None
) -> tuple[list[Member], int, bool]:
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
    return _compressed_ends(found, mark), end, False


def _compressed_ends(found: list[Member], mark: Callable[[], int] | None) -> list[Member]:
    """Member i's data lies before member i+1's header, so the compressed bytes read when
    that header was seen (or at the end) are enough to decompress it."""
    if mark is None:
        return found
    after = [m[3] for m in found[1:]] + [mark()]
    return [(n, o, s, a) for (n, o, s, _), a in zip(found, after)]


class _NeedsTarfile(Exception):
    """A header our walk leaves to tarfile."""


_REGULAR = (b"0", b"\0", b"7")  # tarfile's REGTYPE, AREGTYPE, CONTTYPE
_OTHER = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos: no data
_ZERO = bytes(BLOCK)


def choose_ranged(walked: int, members: int, crossover: int | None) -> bool:
    """Whether to read the rest of a tar's headers one small read at a time: when its
    first members (`members` of them in its first `walked` bytes) lie `crossover` bytes
    apart or more on average. A body skipped saves its bytes, a header read costs a
    request: ranged reads win where one request costs less than reading `crossover`
    bytes (measured by scripts/bench_index.py; see LOCAL_CROSSOVER, REMOTE_CROSSOVER)."""
    if crossover is None:
        return False
    return walked >= crossover * max(1, members)


def _walk_headers(
    f: Any,
    url: str,
    mark: Callable[[], int] | None = None,
    crossover: int | None = None,
) -> tuple[list[Member], int, bool]:
    """What `_tarfile_members` returns (True when the end-of-archive block was seen), for
    plain ustar/GNU/v7 headers only (what tar writers emit for short ASCII names); raises
    _NeedsTarfile on any other header.

    tarfile costs ~30 us a member (a TarInfo object, its checks); WebDataset shards hold
    many small members, and this walk reads the same fields in ~3.5 us: 480,000 members
    index in 2.7 s instead of 15 s. Checksums are verified as tarfile does (unsigned sums
    of all the headers of a buffer at once, signed sums where those differ).

    Reads: 1 MiB at a time; with `crossover` (see `choose_ranged`), after the first 1 MiB
    (at once when 0) one `_PEEK`-byte read at each header the buffer does not hold,
    skipping the member bodies between them.
    """
    found: list[Member] = []
    pos, base, buf = 0, 0, b""
    heads: list[tuple[int, int]] = []  # (header offset in buf, stored checksum) to verify
    step, decided = max(_SCANBLOCK, BLOCK), crossover is None
    if crossover == 0:
        step, decided = _ranged(f), True
    elif not decided:
        _readahead(f, 0)  # the first 1 MiB exactly: the choice may skip what follows
    while True:
        if pos + BLOCK > base + len(buf):
            _verify(buf, heads, base, url)
            heads = []
            if not decided and buf:  # the first buffer is walked: choose for the rest
                decided = True
                if choose_ranged(pos, len(found), crossover):
                    step = _ranged(f)
                else:
                    _readahead(f, _SCANBLOCK)
            try:
                f.seek(pos)
                base, buf = pos, f.read(step)
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise ShardError(f"{redact(url)}: corrupt or truncated archive ({e})") from e
            if len(buf) < BLOCK:
                # no room for a header: the end check reports it
                return _compressed_ends(found, mark), pos, False
        at = pos - base
        hdr = buf[at : at + BLOCK]
        if hdr == _ZERO:
            _verify(buf, heads, base, url)
            return _compressed_ends(found, mark), pos, True  # the end-of-archive block
        kind = hdr[156:157]
        field = hdr[124:136]
        if field[0] & 0x80 or (kind not in _REGULAR and kind not in _OTHER):
            raise _NeedsTarfile  # base-256 size, pax / GNU long name / sparse / vendor
        try:
            length = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
            stored = int(hdr[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            raise ShardError(
                f"{redact(url)}: corrupt or truncated tar (bad header at byte {pos})"
            ) from None
        heads.append((at, stored))
        name = hdr[:100].split(b"\0", 1)[0]
        prefix = hdr[345:500].split(b"\0", 1)[0]  # ustar's; tarfile reads it in any header
        if prefix:
            name = prefix + b"/" + name
        text = name.decode("utf-8", "surrogateescape")
        pos += BLOCK
        if kind in _OTHER or (kind == b"\0" and text.endswith("/")):
            continue  # tarfile skips no data after these
        found.append((text, pos, length, mark() if mark else 0))
        pos += -(-length // BLOCK) * BLOCK


def _readahead(f: Any, nbytes: int) -> None:
    if isinstance(f, RangeFile):
        f.readahead(nbytes)


def _ranged(f: Any) -> int:
    """Switch `f` to reads without readahead (a RangeFile: one request per read) and give
    the size of a ranged header read."""
    _readahead(f, 0)
    return _PEEK


def _verify(buf: bytes, heads: list[tuple[int, int]], base: int, url: str) -> None:
    """Check the stored checksums of the headers at `heads` in `buf`, vectorized."""
    if not heads:
        return
    at = np.array([a for a, _ in heads], dtype=np.int64)
    stored = np.array([c for _, c in heads], dtype=np.int64)
    _check_sums(_rows(buf, at), stored, at, base, url)


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


def _octal(fields: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """Octal number fields (n, 8) as tarfile's ``nti`` reads them (up to the first NUL,
    spaces around the digits), vectorized; -1 where a field is not one."""
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
# reading the bodies: a small read's time x the sequential rate (scripts/bench_index.py
# --only crossover). Local files: 0.03 ms x 4.2 GB/s = 116 KiB (end to end, ranged reads
# win from 128 KiB members). S3: a round trip x a connection's rate: 6.5 ms x 110 MB/s =
# 700 KiB at a local moto server, 1.7 MB through a proxy adding 30 ms, 2-5 MB for S3's
# 20-50 ms first byte at 80-100 MB/s.
LOCAL_CROSSOVER = 128 << 10
REMOTE_CROSSOVER = 2 << 20


def crossover_for(fs: Any) -> int:
    """The member spacing from which header reads skip bodies on this filesystem."""
    return LOCAL_CROSSOVER if isinstance(fs, LocalFileSystem) else REMOTE_CROSSOVER
