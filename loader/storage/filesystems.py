"""Storage: URLs plus plain storage_options, opened through fsspec (local, s3fs, ...).

Nothing here holds an open filesystem across a fork: callers pass the URL and the
storage_options (both picklable) and open the filesystem in the process that reads.
fsspec's instance cache is per process, so each DataLoader worker gets its own.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from fsspec.asyn import sync
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import tokenize

from ..errors import STALE, StaleIndexError, redact
from .ranged_get import http_ranges, is_http, s3_ranges
from .store_errors import denied
from .trips import trip, trip_to

__all__ = [
    "FileEntry",
    "UrlOrPath",
    "as_url",
    "cat_ranges",
    "check_version",
    "connect",
    "denied",
    "filesystem",
    "is_azure",
    "is_local",
    "is_object_store",
    "is_s3",
    "redact",
    "stale_now",
    "strip_credentials",
    "version_of",
]

log = logging.getLogger(__name__)

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")

UrlOrPath = str | os.PathLike[str]  # a URL, a local path, or a pathlib.Path


@overload
def as_url(source: UrlOrPath) -> str: ...
@overload
def as_url(source: object) -> Any: ...
def as_url(source: object) -> Any:
    """`source` with paths made strings: an os.PathLike (a pathlib.Path) by os.fspath, a
    list or tuple of URLs and paths as a list of strings; anything else as it is (so the
    caller's own check names it)."""
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if isinstance(source, list | tuple) and any(isinstance(u, os.PathLike) for u in source):
        return [os.fspath(u) if isinstance(u, os.PathLike) else u for u in source]
    return source


def strip_credentials(url: str) -> str:
    """The URL without embedded credentials, for what is saved (credentials belong in
    storage_options or the environment)."""
    return _USERINFO.sub("", str(url))


GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(filesystem, path) for a URL; s3:// URLs use s3fs's options, e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}``, and otherwise the standard AWS variables
    (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). For s3:// the retry and timeout settings
    the options leave out are filled in (loader.storage.s3.s3_defaults), and `retries`
    (tries of each call by s3fs) is an option too. gs:// and az:// / abfs:// URLs
    take gcsfs's and adlfs's options, through the subclasses in loader.storage.gcs and
    loader.storage.azure (one try per call, bounded timeouts)."""
    protocol = split_protocol(str(url))[0]
    try:
        if protocol in ("s3", "s3a"):
            from .s3 import S3FileSystem, s3_defaults  # s3fs is imported for S3 URLs only

            options = {**S3FileSystem._get_kwargs_from_urls(url), **s3_defaults(storage_options)}
            s3 = _shared(S3FileSystem, options)
            return s3, str(s3._strip_protocol(url))
        if protocol in GCS_PROTOCOLS or protocol in AZURE_PROTOCOLS:
            cls = _store_class(protocol)
            store = _shared(cls, {**cls._get_kwargs_from_urls(url), **(storage_options or {})})
            return store, str(store._strip_protocol(url))
        fs, path = url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        extra = "gcs" if protocol in GCS_PROTOCOLS else "azure"
        store = protocol in GCS_PROTOCOLS or protocol in AZURE_PROTOCOLS
        hint = f" (pip install 'shardstream[{extra}]')" if store else ""
        raise ValueError(f"cannot open {redact(url)}: {e}{hint}") from e
    except ValueError as e:
        raise ValueError(f"cannot open {redact(url)}: {redact(str(e))}") from e
    return fs, str(path)


def connect(source: object, storage_options: dict[str, Any] | None = None) -> None:
    """Open this process's filesystem for `source` (a URL, or a list of them: its first) and
    its client: for S3, s3fs's import and a botocore client, ~0.5 s of CPU on a busy
    machine. Ranks call it while rank 0 looks for or lists the index, so that it is not on
    the path after rank 0's answer. Errors are left for the reads that follow, which name
    the shard (debug log only)."""
    first = source if isinstance(source, str | os.PathLike) else None
    if isinstance(source, list | tuple) and source:
        first = source[0]
    if not isinstance(first, str | os.PathLike):
        return
    url = os.fspath(first)
    try:
        fs, _ = filesystem(url, storage_options)
        opened = getattr(fs, "connect", None)
        if callable(opened):
            opened()
    except Exception as e:  # the reads report what is wrong
        log.debug("connecting for %s: %s", redact(url), e)


def _shared(cls: Any, options: dict[str, Any]) -> Any:
    """One instance of an object store's filesystem per process and options, whichever
    thread asks. fsspec's instance cache is per thread (its token holds the thread id), so
    each reader thread would build its own client: for s3fs a botocore client, about 0.3 s
    of CPU with the GIL held (its service models loaded) before the first request, and a
    connection pool of its own. These filesystems are async ones on fsspec's one IO loop,
    driven through `sync`, so one instance serves every thread. The entry lives in fsspec's
    cache dict, so ``clear_instance_cache()`` drops it too; the pid in the key gives a
    forked DataLoader worker its own."""
    if options.get("skip_instance_cache") or options.get("asynchronous"):
        return cls(**options)
    key = ("shardstream", os.getpid(), tokenize(cls, options))
    found = cls._cache.get(key)
    if found is None:
        found = cls._cache.setdefault(key, cls(**options))
    return found


def _store_class(protocol: str) -> Any:
    """Our filesystem class for a GCS or Azure protocol (its client imported only now)."""
    if protocol in GCS_PROTOCOLS:
        from .gcs import GCSFileSystem

        return GCSFileSystem
    from .azure import AzureBlobFileSystem

    return AzureBlobFileSystem


@dataclass(frozen=True)
class FileEntry:
    """A file found by listing: its URL as the user's source names it (``data/a.tar`` for
    a source ``data/``, as webdataset gives ``__url__``), size in bytes, version (ETag or
    modification time), and its path below the listed directory (for Hive partitions and
    the rule that names starting with ``_`` or ``.`` are not data)."""

    url: str
    size: int
    version: str | None
    relpath: str = ""


def _local_version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}:{st.st_ino}"


def version_of(fs: Any, info: dict[str, Any]) -> str | None:
    """What changes when the file's content changes: S3's and Azure's ETag, GCS's
    generation; for local files the modification time in nanoseconds and the inode (a
    rewrite in place or a replacement by rename; the filesystem's timestamp granularity
    bounds what is seen); else whatever modification time the filesystem reports."""
    if isinstance(fs, LocalFileSystem):
        return _local_version(os.stat(info["name"]))
    for key in (
        "generation",  # GCS: changes on every write (its etag changes on metadata edits too)
        "ETag",
        "etag",
        "mtime",
        "LastModified",
        "Last-Modified",
        "last_modified",
        "created",
    ):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return None


def entry_of(fs: Any, info: dict[str, Any], url: str | None = None) -> FileEntry:
    """The FileEntry of an fsspec info dict; `url` names the file as the user gave it
    (default: the filesystem's full URL)."""
    name = url if url is not None else fs.unstrip_protocol(info["name"])
    if info.get("size") is None:
        raise ValueError(
            f"{redact(name)}: the storage gives no size for this file (an HTTP server "
            "without Content-Length?): shardstream needs it to read by ranges"
        )
    return FileEntry(name, int(info["size"]), version_of(fs, info))


def stale_reason(url: str, size: int, version: str | None, now: FileEntry | None) -> str | None:
    """Why the file indexed as (size, version) no longer matches `now` (None if it does).
    An index that recorded no version (a manifest without one) is checked by size only."""
    if now is not None and now.size == size and version in (None, now.version):
        return None
    found = "missing" if now is None else f"{now.size} bytes, version {now.version}"
    return f"{redact(url)} (indexed {size} bytes, version {version}; now {found})"


def stale_now(fs: Any, url: str, size: int, version: str | None) -> str | None:
    """Why the file indexed as (size, version) is no longer that file (None: it is): one
    stat locally, else one metadata request (not fsspec's cached listing)."""
    path = fs._strip_protocol(url)
    now: FileEntry | None
    try:
        if isinstance(fs, LocalFileSystem):
            st = os.stat(path)
            now = FileEntry(url, st.st_size, _local_version(st))
        else:
            fs.invalidate_cache(path)
            with trip():
                now = entry_of(fs, fs.info(path), url)
    except FileNotFoundError:
        now = None
    return stale_reason(url, size, version, now)


def check_version(fs: Any, url: str, size: int, version: str | None) -> None:
    """StaleIndexError naming the file when it is no longer the indexed one (`stale_now`),
    after a read: bytes of a file replaced before or during it are never decoded."""
    reason = stale_now(fs, url, size, version)
    if reason:
        raise StaleIndexError(f"{reason}: {STALE}")


def is_local(fs: Any) -> bool:
    """Whether `fs` is the local disk (fsspec's LocalFileSystem)."""
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def is_object_store(fs: Any) -> bool:
    """Whether `fs` is S3, GCS or Azure (listings give each file's size and version)."""
    return _store_reads(fs) is not None


def _protocols(fs: Any) -> set[str]:
    return set(fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,))


def is_s3(fs: Any) -> bool:
    return bool({"s3", "s3a"} & _protocols(fs))


def is_azure(fs: Any) -> bool:
    return bool(set(AZURE_PROTOCOLS) & _protocols(fs))


def _store_reads(fs: Any) -> Any:
    """The object store's checked ranged reads for `fs` (S3, GCS, Azure), each a coroutine
    function of (fs, urls, paths, starts, ends, indexed); None for other filesystems."""
    if is_s3(fs):
        return s3_ranges
    if set(GCS_PROTOCOLS) & _protocols(fs):
        from .gcs import gcs_ranges

        return gcs_ranges
    if is_azure(fs):
        from .azure import azure_ranges

        return azure_ranges
    return None


Indexed = tuple[int, str | None]  # (size, version) of a file as the index recorded it


def cat_ranges(
    fs: Any,
    urls: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    indexed: Sequence[Indexed] | None = None,
) -> list[bytes | BaseException]:
    """Bytes [starts[i], ends[i]) of urls[i] (or the exception that fetch raised), read
    concurrently where the filesystem can.

    With `indexed` (each file's size and version as the index recorded them), every read
    is of that version: on S3 and Azure each ranged GET carries ``If-Match: <indexed
    ETag>``, on GCS ``ifGenerationMatch`` (no extra request), and a 412 answer becomes
    StaleIndexError; elsewhere each file's size and version are checked after the read
    (`check_version`: one stat locally).
    """
    paths = [fs._strip_protocol(u) for u in urls]
    got: list[bytes | BaseException]
    known: Sequence[tuple[int | None, str | None]] = indexed or [(None, None)] * len(urls)
    store_reads = _store_reads(fs)
    if store_reads is not None:  # the version travels in each GET: nothing to check after
        return list(sync(fs.loop, store_reads, fs, urls, paths, starts, ends, known))
    if is_http(fs):
        sizes = [size for size, _ in known]
        got = list(sync(fs.loop, http_ranges, fs, paths, starts, ends, sizes))
    else:  # a local file is no round trip; another filesystem's reads count as sent together
        with trip_to(fs, len(paths)):
            got = fs.cat_ranges(paths, list(starts), list(ends), on_error="return")
    if indexed is not None:
        stale: dict[str, BaseException | None] = {}
        # a file whose read failed is not asked about (a dead server is no stale file):
        # its error stands, and the retry checks the version again
        failed = {url for url, data in zip(urls, got) if isinstance(data, BaseException)}
        for i, url in enumerate(urls):
            if url in failed:
                continue
            if url not in stale:
                try:
                    check_version(fs, url, *indexed[i])
                    stale[url] = None
                except StaleIndexError as e:
                    stale[url] = e
            error = stale[url]
            if error is not None:
                got[i] = error
    return got
