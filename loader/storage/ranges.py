"""Fetched byte ranges as a file a decoder reads, strictly: a read is served from the
bytes fetched for it, or fetched, never filled in.

pyarrow decodes a remote Parquet shard from the column chunks we fetched (one coalesced
set of ranged reads). fsspec's "parts" cache (``KnownPartsOfAFile``, behind
``AlreadyBufferedFile``) would do that, but by default it answers a read running past
the parts it holds with zeros, which pyarrow decodes as data: a footer whose chunk
lengths are short (parquet-mr before 1.2.9, PARQUET-816) then reads as wrong values,
silently. Its ``strict`` mode raises a bare ValueError instead. Here a read that leaves
the fetched parts fetches the missing bytes (a ranged read of the indexed version, with
the retry policy: see `loader.storage.retry.read_ranges`), logged at DEBUG.
"""

from __future__ import annotations

import bisect
import io
import logging
from collections.abc import Callable, Mapping
from typing import Any

from fsspec.caching import ReadAheadCache

from .filesystems import redact
from .retry import RetryPolicy, read_ranges

__all__ = ["FetchFile", "PartsFile", "RangeFile", "read_span"]

log = logging.getLogger(__name__)

Fetch = Callable[[int, int], bytes]  # (start, end) -> exactly bytes [start, end)


class _ByteFile(io.RawIOBase):
    """A read-only, seekable file of `size` bytes whose reads `_range(start, end)` serves."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._pos = size, 0

    def _range(self, start: int, end: int) -> bytes:
        raise NotImplementedError

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

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        out = self._range(self._pos, end) if end > self._pos else b""
        self._pos += len(out)
        return out

    def readall(self) -> bytes:
        return self.read(-1)


class PartsFile(_ByteFile):
    """A read-only, seekable file of `size` bytes holding `parts` ({(start, end): bytes},
    each exactly end - start bytes of the file at that offset); reads of bytes outside
    them call `fetch(start, end)`, which must return exactly those bytes (ValueError
    naming the URL otherwise)."""

    def __init__(
        self, url: str, size: int, parts: Mapping[tuple[int, int], bytes], fetch: Fetch
    ) -> None:
        super().__init__(size)
        self.url, self._fetch = url, fetch
        self._starts: list[int] = []
        self._blobs: list[bytes] = []
        for (a, b), blob in sorted(parts.items()):
            if len(blob) != b - a:
                raise ValueError(
                    f"{redact(url)}: bytes [{a}, {b}) hold {len(blob)} bytes, not {b - a}"
                )
            self._add(a, blob)

    def _add(self, start: int, blob: bytes) -> None:
        i = bisect.bisect_right(self._starts, start)
        self._starts.insert(i, start)
        self._blobs.insert(i, blob)

    def _range(self, start: int, end: int) -> bytes:
        """Bytes [start, end): from the part holding them (the common case: one slice),
        else pieced together from parts and fetches of the gaps."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and start + (end - start) <= self._starts[i] + len(self._blobs[i]):
            at = start - self._starts[i]
            return self._blobs[i][at : at + end - start]
        pieces, pos = [], start
        while pos < end:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i >= 0 and pos < self._starts[i] + len(self._blobs[i]):
                at = pos - self._starts[i]
                piece = self._blobs[i][at : at + end - pos]
            else:  # a gap: up to the next part, or the end
                nxt = self._starts[i + 1] if i + 1 < len(self._starts) else end
                stop = min(end, nxt)
                piece = self._fetched(pos, stop)
            pieces.append(piece)
            pos += len(piece)
        return b"".join(pieces)

    def _fetched(self, start: int, end: int) -> bytes:
        log.debug(
            "%s: fetching bytes [%d, %d), outside the ranges fetched", redact(self.url), start, end
        )
        blob = self._fetch(start, end)
        if len(blob) != end - start:
            raise ValueError(
                f"{redact(self.url)}: a read of bytes [{start}, {end}) returned {len(blob)} bytes"
            )
        self._add(start, blob)
        return blob


class FetchFile(_ByteFile):
    """A read-only, seekable file of `size` bytes, each read of bytes [start, end) served by
    `fetch(start, end)` (exactly those bytes: ValueError naming the URL otherwise), nothing
    kept: a cached shard read through the node cache, which holds the bytes itself."""

    def __init__(self, url: str, size: int, fetch: Fetch) -> None:
        super().__init__(size)
        self.url, self._fetch = url, fetch

    def _range(self, start: int, end: int) -> bytes:
        blob = self._fetch(start, end)
        if len(blob) != end - start:
            raise ValueError(
                f"{redact(self.url)}: a read of bytes [{start}, {end}) returned {len(blob)} bytes"
            )
        return blob


def read_span(
    fs: Any,
    url: str,
    start: int,
    end: int,
    retry: RetryPolicy,
    indexed: tuple[int, str | None],
    piece: int | None = None,
) -> bytes:
    """Bytes [start, end) of the indexed version of `url` (`read_ranges`); with `piece`, as
    ranged reads of at most that many bytes sent together and joined: over an object store
    one round trip at several connections' rate, where one request runs at one's."""
    step = piece or max(1, end - start)
    starts = list(range(start, end, step)) or [start]
    ends = [min(a + step, end) for a in starts]
    got = read_ranges(fs, [url] * len(starts), starts, ends, retry, [indexed] * len(starts))
    return got[0] if len(got) == 1 else b"".join(got)


class RangeFile(_ByteFile):
    """A read-only file of the indexed version of a shard over `read_ranges` (checked
    lengths and retries on every fetch), reading `readahead` bytes at each miss.

    The tar scan walks headers through this instead of `fs.open`, whose buffered reads can
    come back short when a connection drops mid-body; fsspec's ReadAheadCache supplies the
    readahead, our fetcher the retries (the Fetcher seam of fsspec.caching). With `piece`,
    a fetch longer than that is made of `piece`-byte ranged reads sent together: over an
    object store a large readahead then costs one round trip, not one connection's rate
    for all of it.
    """

    def __init__(
        self,
        fs: Any,
        url: str,
        size: int,
        retry: RetryPolicy,
        version: str | None = None,
        readahead: int = 1 << 20,
        piece: int | None = None,
    ) -> None:
        super().__init__(size)
        self.block = readahead  # the readahead it was made with (`readahead(None)`)

        def fetch(start: int, end: int) -> bytes:
            return read_span(fs, url, start, min(end, size), retry, (size, version), piece)

        self._cache = ReadAheadCache(readahead, fetch, size)

    def readahead(self, nbytes: int | None) -> None:
        """Fetch `nbytes` beyond each read that misses the cache (0: exactly what is read;
        None: the readahead the file was made with)."""
        self._cache.blocksize = self.block if nbytes is None else nbytes

    def _range(self, start: int, end: int) -> bytes:
        data: bytes = self._cache._fetch(start, end)
        return data
