"""Tar shards in the WebDataset convention: one sequential header pass to index, byte-range
reads of exactly the assigned members afterwards.

webdataset streams a tar from its start; it cannot read record 5000 without reading the
4999 before it. We index each record's member byte ranges once (with webdataset's own
key/extension rule, `base_plus_ext`, and its meta-file skipping) so that a rank reads only
its members, in one coalesced range read per piece.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from fsspec.caching import ReadAheadCache
from fsspec.implementations.local import LocalFileSystem

from ..errors import ShardError
from ..retry import RetryPolicy, read_ranges
from ..shard import Shard
from ..storage import FileEntry, redact
from .deferred import complete, estimated_bytes, is_deferred

__all__ = ["RangeFile", "TarFormat", "choose_ranged", "group_members", "scan_tar"]

_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta default
# webdataset's base_plus_ext (key, then every extension), compiled once: it calls
# re.match with the pattern string, a cache lookup that was a third of the index time
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_SCAN_BLOCK = 1 << 20  # readahead while walking the headers
# a ranged header read: the header and what follows it, so a small member after a large
# one (a .cls after a .jpg) and the next header usually come with it in one request
_PEEK = 8 << 10
GROUP_BYTES = 1 << 20  # a read group: consecutive records holding at least this many bytes
_SAMPLE_OVERHEAD = 256  # bytes a sample dict and its key take beyond its members' data
_BLOCK = tarfile.BLOCKSIZE  # 512: a header; two zero blocks end an archive


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
        _readahead(f, _SCAN_BLOCK)  # tarfile reads a header at a time
        found, end, closed = _tarfile_members(f, url, mark)
    keys, members, ends = group_members(found, url, size)
    if not closed:
        f.seek(end)
        closed = f.read(_BLOCK) == bytes(_BLOCK)
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
_ZERO = bytes(_BLOCK)


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
    step, decided = max(_SCAN_BLOCK, _BLOCK), crossover is None
    if crossover == 0:
        step, decided = _ranged(f), True
    elif not decided:
        _readahead(f, 0)  # the first 1 MiB exactly: the choice may skip what follows
    while True:
        if pos + _BLOCK > base + len(buf):
            _verify(buf, heads, base, url)
            heads = []
            if not decided and buf:  # the first buffer is walked: choose for the rest
                decided = True
                if choose_ranged(pos, len(found), crossover):
                    step = _ranged(f)
                else:
                    _readahead(f, _SCAN_BLOCK)
            try:
                f.seek(pos)
                base, buf = pos, f.read(step)
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise ShardError(f"{redact(url)}: corrupt or truncated archive ({e})") from e
            if len(buf) < _BLOCK:
                # no room for a header: the end check reports it
                return _compressed_ends(found, mark), pos, False
        at = pos - base
        hdr = buf[at : at + _BLOCK]
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
        pos += _BLOCK
        if kind in _OTHER or (kind == b"\0" and text.endswith("/")):
            continue  # tarfile skips no data after these
        found.append((text, pos, length, mark() if mark else 0))
        pos += -(-length // _BLOCK) * _BLOCK


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
    # headers start at multiples of 512 in the file, and `buf` at one too
    blocks = np.frombuffer(buf, dtype=np.uint8, count=len(buf) // _BLOCK * _BLOCK)
    at = np.array([a for a, _ in heads], dtype=np.int64)
    rows = blocks.reshape(-1, _BLOCK)[at // _BLOCK]  # (n, 512) the headers
    # the checksum field counts as eight spaces
    unsigned = rows.sum(axis=1, dtype=np.int64) - rows[:, 148:156].sum(axis=1) + 8 * 32
    stored = np.array([c for _, c in heads], dtype=np.int64)
    for i in np.flatnonzero(unsigned != stored):  # rare: old writers summed signed bytes
        # (tarfile.calc_chksums does this too, but is not public API)
        signed = unsigned[i] - 256 * int((rows[i] > 127).sum() - (rows[i, 148:156] > 127).sum())
        if signed != stored[i]:
            raise ShardError(
                f"{redact(url)}: corrupt or truncated tar (bad header checksum at byte "
                f"{base + int(at[i])})"
            )


def _check_headers(data: bytes, lo: int, records: Sequence[Any], url: str) -> None:
    """The header block before each member's data in `data` (bytes [lo, ...) of the tar
    stream) must carry a valid checksum: bytes that are not the indexed members (a range
    answered from the wrong offset, zeros, another file) are a ShardError, never samples."""
    heads = []
    for members in records:
        for _, off, _size in members:
            at = off - _BLOCK - lo
            field = data[at + 148 : at + 156]
            try:
                stored = int(field.split(b"\0", 1)[0].strip() or b"-1", 8)
            except ValueError:
                stored = -1
            if stored < 0:
                raise ShardError(
                    f"{redact(url)}: the bytes read at {lo + at} are not the tar header the "
                    "index recorded (no checksum): the shard changed, or the storage "
                    "returned other bytes; rebuild the index"
                )
            heads.append((at, stored))
    _verify(data, heads, lo, url)


class RangeFile(io.RawIOBase):
    """A read-only file over `read_ranges`: checked lengths and retries on every fetch.

    The tar scan walks headers through this instead of `fs.open`, whose buffered reads can
    come back short when a connection drops mid-body; fsspec's ReadAheadCache supplies the
    readahead, our fetcher the retries (the Fetcher seam of fsspec.caching).
    """

    def __init__(
        self, fs: Any, url: str, size: int, retry: RetryPolicy, version: str | None = None
    ) -> None:
        super().__init__()
        indexed = [(size, version)]

        def fetch(start: int, end: int) -> bytes:
            return read_ranges(fs, [url], [start], [min(end, size)], retry, indexed)[0]

        self._cache = ReadAheadCache(_SCAN_BLOCK, fetch, size)
        self._size, self._pos = size, 0

    def readahead(self, nbytes: int) -> None:
        """Fetch `nbytes` beyond each read that misses the cache (0: exactly what is read)."""
        self._cache.blocksize = nbytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        data = self._cache._fetch(self._pos, end) if end > self._pos else b""
        self._pos += len(data)
        return data


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


def _compression(url: str) -> str | None:
    lower = url.lower()
    return "gzip" if lower.endswith((".tar.gz", ".tgz")) else None


class TarFormat:
    """Tar shards, plain or gzip-compressed (``.tar.gz``, ``.tgz``, as webdataset reads
    them). gzip has no random access: a compressed shard's index records its members in
    the decompressed stream, and a read decompresses the shard from its start up to the
    last asked member (``piece_bytes`` counts those compressed bytes)."""

    name = "tar"
    suffixes = (".tar", ".tar.gz", ".tgz")

    def __init__(
        self,
        decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.decode_sample = decode
        self.retry = retry or RetryPolicy()
        self._tensors: dict[str, bool] = {}  # batch fields: tensor or list, once decided

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """Each shard's records and member ranges from its headers (sidecars are read by
        loader.formats.tar_index before this): plain tars choose sequential or ranged
        header reads from their first members (`crossover`), compressed ones are read
        through, decompressing. Shards are scanned 16 at a time."""
        crossover = crossover_for(fs)

        def one(entry: FileEntry) -> dict[str, Any]:
            raw = RangeFile(fs, entry.url, entry.size, self.retry, entry.version)
            if _compression(entry.url) is None:
                return scan_tar(raw, entry.url, entry.size, crossover=crossover)
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                out = scan_tar(gz, entry.url, None, mark=raw.tell)
            out["details"]["compression"] = "gzip"
            return out

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(entries)))) as pool:
            return list(pool.map(one, entries))

    def _span(self, fs: Any, shard: Shard, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the shard's tar stream, of the indexed version."""
        if shard.details.get("compression") is None:
            indexed = [(shard.bytes, shard.version)]
            return read_ranges(fs, [shard.url], [lo], [hi], self.retry, indexed)[0]
        raw = RangeFile(fs, shard.url, shard.bytes, self.retry, shard.version)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                gz.seek(lo)  # decompresses what lies before: gzip has no random access
                data = gz.read(hi - lo)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ShardError(f"{redact(shard.url)}: corrupt or truncated gzip ({e})") from e
        if len(data) < hi - lo:
            raise ShardError(
                f"{redact(shard.url)}: the decompressed tar ends before byte {hi}; the shard "
                "changed or is truncated: rebuild the index"
            )
        return data

    def read(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> list[dict[str, Any]]:
        """Records [start, stop) as webdataset sample dicts, from one range read spanning
        their members (the headers between them come along; they are small). `__url__` is
        the shard's URL as the source named it."""
        return self.decode(fs, self.fetch(fs, shard, start, stop, columns))

    def fetch(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> tuple[Shard, int, int, Sequence[str] | None, int, bytes]:
        """The storage part of `read`: the bytes spanning the records' members."""
        shard = complete(self, fs, shard)  # a shard only counted so far: its headers now
        recs = shard.details["members"][start:stop]
        lo = recs[0][0][1] - _BLOCK  # from the first member's header: `decode` checks it
        hi = max(off + size for _, off, size in recs[-1])
        return shard, start, stop, columns, lo, self._span(fs, shard, lo, hi)

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
    ) -> list[tuple[Shard, int, int, Sequence[str] | None, int, bytes]]:
        """`fetch` of several record ranges of one shard (one range read each)."""
        return [self.fetch(fs, shard, a, b, columns) for a, b in rows]

    def decode(
        self, fs: Any, got: tuple[Shard, int, int, Sequence[str] | None, int, bytes]
    ) -> list[dict[str, Any]]:
        """The samples from what `fetch` got (webdataset's decoders applied, if any)."""
        shard, start, stop, columns, lo, data = got
        _check_headers(data, lo, shard.details["members"][start:stop], shard.url)
        keep = None if columns is None else set(columns)
        out = []
        for key, members in zip(
            shard.details["keys"][start:stop], shard.details["members"][start:stop]
        ):
            sample: dict[str, Any] = {"__key__": key, "__url__": shard.url}
            for ext, off, size in members:
                if keep is None or ext in keep:
                    sample[ext] = data[off - lo : off - lo + size]
            out.append(self.decode_sample(sample) if self.decode_sample else sample)
        return out

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes a read of records [start, stop) fetches: one range spanning their members;
        for a compressed shard, everything from its start to the last one's end."""
        if start >= stop:
            return 0
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop)
        ends = shard.details.get("compressed_ends")
        if ends is not None:
            return int(min(shard.bytes, ends[stop - 1]))
        recs = shard.details["members"][start:stop]
        return int(max(o + n for _, o, n in recs[-1]) - recs[0][0][1]) if recs else 0

    def groups(self, shard: Shard) -> list[int]:
        """Records of each read group: consecutive records holding GROUP_BYTES of member
        data (one range read each). A compressed shard is one group: gzip has no random
        access, so every group would decompress the shard from its start; a deferred shard
        (a count from a manifest, no member offsets yet) is one too."""
        n = shard.num_records
        if shard.details.get("compression") is not None or n == 0 or is_deferred(shard):
            return [n] if n else []
        out: list[int] = []
        rows = size = 0
        for members in shard.details["members"]:
            rows += 1
            size += sum(m[2] for m in members)
            if size >= GROUP_BYTES:
                out.append(rows)
                rows = size = 0
        if rows:
            out.append(rows)
        return out

    def estimate(self, shard: Shard, start: int, stop: int, columns: Sequence[str] | None) -> int:
        """Bytes the samples of records [start, stop) hold: their members' data (the asked
        extensions) plus a sample dict each."""
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop) + _SAMPLE_OVERHEAD * (stop - start)
        keep = None if columns is None else set(columns)
        data = sum(
            m[2]
            for members in shard.details["members"][start:stop]
            for m in members
            if keep is None or m[0] in keep
        )
        return int(data + _SAMPLE_OVERHEAD * (stop - start))

    def reserve(self, nbytes: int) -> None:
        pass  # samples are Python objects: nothing to set aside

    def check(self, joined: list[Any], shard: Shard) -> None:
        pass  # nothing depends on reading order

    def join(self, parts: Sequence[list[Any]]) -> list[Any]:
        return [x for part in parts for x in part]

    def release(self, joined: list[Any]) -> None:
        pass  # the samples are handed out themselves; nothing to reuse

    def nbytes(self, joined: list[Any]) -> int:
        """Bytes the samples hold: their bytes values, and a sample dict each."""
        return sum(
            _SAMPLE_OVERHEAD + sum(len(v) for v in x.values() if isinstance(v, bytes))
            for x in joined
        )

    def take(self, joined: list[Any], indices: Any) -> list[Any]:
        return [joined[i] for i in indices.tolist()]

    def gather(self, joined: Sequence[list[Any]], which: Any, rows: Any) -> list[Any]:
        """Sample rows[k] of joined[which[k]], for each k in order."""
        return [joined[w][r] for w, r in zip(np.asarray(which).tolist(), np.asarray(rows).tolist())]

    def cut(self, taken: list[Any], lo: int, hi: int) -> list[Any]:
        return taken[lo:hi]

    def records(self, taken: list[Any]) -> list[Any]:
        return taken

    def batch(self, taken: list[dict[str, Any]]) -> dict[str, Any]:
        """Field -> list of values; a field whose values were all plain ints or floats in
        the first batch holding it -> a tensor, in every batch after (a later batch where
        it is missing or not a number raises ShardError naming the field and a sample)."""
        fields = list(dict.fromkeys(k for sample in taken for k in sample))
        out: dict[str, Any] = {}
        for name in fields:
            values = [sample.get(name) for sample in taken]
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            tensor = self._tensors.setdefault(name, numeric and bool(values))
            if tensor and not numeric:
                bad = next(s for s, v in zip(taken, values) if not isinstance(v, int | float))
                raise ShardError(
                    f"{redact(str(bad.get('__url__')))}: field {name!r} of sample "
                    f"{bad.get('__key__')!r} is {type(bad.get(name)).__name__}, but earlier "
                    "batches made it a tensor of numbers; a batch field keeps one kind"
                )
            out[name] = torch.tensor(values) if tensor else values
        return out
