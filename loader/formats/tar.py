"""Tar shards in the WebDataset convention: one sequential header pass to index, byte-range
reads of exactly the assigned members afterwards.

webdataset streams a tar from its start; it cannot read record 5000 without reading the
4999 before it. We index each record's member byte ranges once (with webdataset's own
key/extension rule, `base_plus_ext`, and its meta-file skipping) so that a rank reads only
its members, in one coalesced range read per piece.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from fsspec.caching import ReadAheadCache
from webdataset.tariterators import base_plus_ext

from ..errors import ShardError
from ..retry import RetryPolicy, read_ranges
from ..shard import Shard
from ..storage import FileEntry, redact

__all__ = ["TarFormat", "scan_tar"]

_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta default
_SCAN_BLOCK = 1 << 20  # readahead while walking the headers
_BLOCK = tarfile.BLOCKSIZE  # 512: a header; two zero blocks end an archive


def scan_tar(f: Any, url: str, size: int) -> dict[str, Any]:
    """Index an open tar file: per record its key and members [ext, data offset, size].

    Members with the same key next to each other form one record, as webdataset's
    group_by_keys does. A tar cut short raises ShardError rather than losing its tail:
    inside a member, or between members (Python's tarfile then simply stops, so we check
    for the end-of-archive block ourselves).
    """
    keys: list[str] = []
    members: list[list[list[Any]]] = []
    try:
        with tarfile.open(fileobj=f, mode="r:") as tf:
            for info in tf:
                if not info.isreg() or _SKIP_META.match(info.name):
                    continue
                key, ext = base_plus_ext(info.name)
                if key is None:
                    continue
                if info.offset_data + info.size > size:
                    raise ShardError(
                        f"{redact(url)}: truncated tar: member {info.name} ends at byte "
                        f"{info.offset_data + info.size} of a {size}-byte file"
                    )
                if not keys or keys[-1] != key:
                    keys.append(key)
                    members.append([])
                members[-1].append([ext.lower(), info.offset_data, info.size])
            end = tf.offset  # where the next header would start
    except tarfile.TarError as e:
        raise ShardError(f"{redact(url)}: corrupt or truncated tar ({e})") from e
    f.seek(end)
    if f.read(_BLOCK) != bytes(_BLOCK):
        raise ShardError(
            f"{redact(url)}: truncated tar: no end-of-archive block after byte {end} of "
            f"{size}; the file was cut short (re-upload it)"
        )
    return {"num_records": len(keys), "details": {"keys": keys, "members": members}}


class RangeFile(io.RawIOBase):
    """A read-only file over `read_ranges`: checked lengths and retries on every fetch.

    The tar scan walks headers through this instead of `fs.open`, whose buffered reads can
    come back short when a connection drops mid-body; fsspec's ReadAheadCache supplies the
    readahead, our fetcher the retries (the Fetcher seam of fsspec.caching).
    """

    def __init__(self, fs: Any, url: str, size: int, retry: RetryPolicy) -> None:
        super().__init__()

        def fetch(start: int, end: int) -> bytes:
            return read_ranges(fs, [url], [start], [min(end, size)], retry)[0]

        self._cache = ReadAheadCache(_SCAN_BLOCK, fetch, size)
        self._size, self._pos = size, 0

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


class TarFormat:
    name = "tar"
    suffixes = (".tar",)

    def __init__(
        self,
        decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.decode = decode
        self.retry = retry or RetryPolicy()

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        def one(entry: FileEntry) -> dict[str, Any]:
            return scan_tar(RangeFile(fs, entry.url, entry.size, self.retry), entry.url, entry.size)

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(entries)))) as pool:
            return list(pool.map(one, entries))

    def read(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> list[dict[str, Any]]:
        """Records [start, stop) as webdataset sample dicts, from one range read spanning
        their members (the headers between them come along; they are small)."""
        url, details = shard.url, shard.details
        recs = details["members"][start:stop]
        lo = recs[0][0][1]
        hi = max(off + size for _, off, size in recs[-1])
        (data,) = read_ranges(fs, [url], [lo], [hi], self.retry)
        keep = None if columns is None else set(columns)
        out = []
        for key, members in zip(details["keys"][start:stop], recs):
            sample: dict[str, Any] = {"__key__": key, "__url__": url}
            for ext, off, size in members:
                if keep is None or ext in keep:
                    sample[ext] = data[off - lo : off - lo + size]
            out.append(self.decode(sample) if self.decode else sample)
        return out

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes of the single range read that fetches records [start, stop)."""
        recs = shard.details["members"][start:stop]
        return int(max(o + n for _, o, n in recs[-1]) - recs[0][0][1]) if recs else 0

    def join(self, parts: Sequence[list[Any]]) -> list[Any]:
        return [x for part in parts for x in part]

    def release(self, joined: list[Any]) -> None:
        pass  # the samples are handed out themselves; nothing to reuse

    def take(self, joined: list[Any], indices: Any) -> list[Any]:
        return [joined[i] for i in indices.tolist()]

    def records(self, taken: list[Any]) -> list[Any]:
        return taken

    def batch(self, taken: list[dict[str, Any]]) -> dict[str, Any]:
        """Field -> list of values; fields of plain ints or floats -> a tensor."""
        fields = list(dict.fromkeys(k for sample in taken for k in sample))
        out: dict[str, Any] = {}
        for name in fields:
            values = [sample.get(name) for sample in taken]
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            out[name] = torch.tensor(values) if numeric and values else values
        return out
