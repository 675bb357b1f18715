"""Listing: the files under a directory, prefix or glob, with their sizes and versions
(one page of an S3 listing at a time, a HEAD each where an HTTP listing gives no size),
and the size and version of one file named by the user."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing, contextmanager
from typing import Any

import fsspec
from fsspec.asyn import sync

from .filesystems import (
    FileEntry,
    entry_of,
    filesystem,
    is_azure,
    is_object_store,
    is_s3,
    redact,
    version_of,
)
from .ranged_get import HTTP_CONCURRENCY, is_http
from .store_errors import denied, store_error
from .trips import trip, trip_to

__all__ = ["LIST_REPORT", "file_entry", "list_ahead", "list_files"]


def _root(path: str) -> str:
    """The directory a glob's matches lie under (the part before its first magic char)."""
    magic = min((i for i, c in enumerate(path) if c in "*?["), default=len(path))
    return path[:magic].rsplit("/", 1)[0] if "/" in path[:magic] else ""


LIST_REPORT = 1000  # an S3 listing page: progress is reported every this many files


def _find(fs: Any, path: str, progress: Callable[[int], None] | None) -> list[dict[str, Any]]:
    """Every file below `path` as fsspec info dicts. On S3 with `progress`, the listing is
    read page by page (s3fs's own paginated listing, as its ``find`` reads it) and
    `progress(files listed so far)` called after each page: a prefix of 1,000,000 keys is
    1,000 LIST requests, one after another."""
    if progress is None or not is_s3(fs) or not hasattr(fs, "_iterdir"):
        infos = list(fs.find(path, detail=True).values())
        if progress is not None:
            progress(len(infos))
        return infos

    async def pages() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        async for info in _s3_keys(fs, path):
            found.append(info)
            if len(found) % LIST_REPORT == 0:
                progress(len(found))
        return found

    found: list[dict[str, Any]] = sync(fs.loop, pages)
    progress(len(found))
    return found


def _s3_keys(fs: Any, path: str) -> Any:
    """s3fs's paginated listing of every key below `path` (as its ``find`` lists them), an
    async iterator of info dicts."""
    bucket, key, _ = fs.split_path(path)
    return fs._iterdir(bucket, delimiter="", prefix=key.rstrip("/") + "/" if key else "")


AHEAD_S = 60.0  # a listing started ahead serves a `list_files` begun within this many seconds


class _Ahead:
    """An object store prefix's listing started before it is asked for (`list_ahead`), on
    fsspec's IO loop. `stop`: no page is asked after the one in flight (S3 and Azure: their
    clients' paginated listings; GCS: gcsfs's `_find`, cancelled)."""

    def __init__(self, fs: Any, path: str) -> None:
        self.stopped = False
        self.made = time.monotonic()

        async def pages() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            async with trip(), aclosing(_s3_keys(fs, path)) as it:
                async for info in it:
                    if self.stopped:
                        break
                    found.append(info)
            return found

        async def blobs() -> list[dict[str, Any]]:
            # adlfs's `_find` lists after a HEAD of the path (is it a blob?): one round
            # trip more in line. This is its listing without the HEAD (a prefix holding
            # nothing: list_files then asks for the file itself, as after `_find`)
            found, below = [], f"{path.rstrip('/')}/"
            container, name, _ = fs.split_path(below)
            async with trip(), fs.service_client.get_container_client(container) as client:
                async for blob in client.list_blobs(include=["metadata"], name_starts_with=name):
                    if self.stopped:
                        break
                    found.append(blob)
            infos = await fs._details(found)
            return [i for i in infos if i["type"] == "file" and i["name"].startswith(below)]

        async def found() -> list[dict[str, Any]]:  # GCS: one listing request (a page a
            async with trip():  # 1,000), as `_find` lists
                return list((await fs._find(path, detail=True)).values())

        fs.invalidate_cache(path)  # (gcsfs keeps listings, as list_files says)
        self.cancel = not is_s3(fs) and not is_azure(fs)
        listing = pages() if is_s3(fs) else blobs() if is_azure(fs) else found()
        self.future = asyncio.run_coroutine_threadsafe(listing, fs.loop)

    def stop(self) -> None:
        self.stopped = True
        if self.cancel:  # (its task then stops at its next await)
            self.future.cancel()


_ahead: dict[tuple[str, int], _Ahead] = {}
_ahead_lock = threading.Lock()


def list_ahead(url: str, storage_options: dict[str, Any] | None = None) -> Callable[[], None]:
    """Start listing `url` (an S3, GCS or Azure prefix) in the background, for a
    `list_files` of the same URL and options that may follow: that listing then waits for
    this one, not for a round trip of its own. The look for a saved index sends it beside
    its GET (loader.index.beside): without an index, one round trip fewer stands in line
    before the first batch; with one, a listing page was asked for nothing. Returns the
    drop: no page is asked after the one in flight (GCS: the listing is cancelled), and a
    later `list_files` lists anew. Other filesystems, and globs: nothing is started."""
    fs, path = filesystem(url, storage_options)
    need = "_iterdir" if is_s3(fs) else "_details" if is_azure(fs) else "_find"
    lists = hasattr(fs, need) and hasattr(fs, "loop")
    if not is_object_store(fs) or not lists or fsspec.core.has_magic(path):
        return lambda: None
    ahead, key = _Ahead(fs, path), (url, id(fs))
    with _ahead_lock:
        _ahead[key] = ahead

    def drop() -> None:
        ahead.stop()
        with _ahead_lock:
            if _ahead.get(key) is ahead:
                del _ahead[key]

    return drop


def _listed_ahead(url: str, fs: Any) -> list[dict[str, Any]] | None:
    """The infos of the listing of `url` started ahead (`list_ahead`), waited for; None
    without one, or where it failed: the caller lists again, and raises what that raises
    (retried as any listing is)."""
    with _ahead_lock:
        ahead = _ahead.pop((url, id(fs)), None)
    if ahead is None or time.monotonic() - ahead.made > AHEAD_S:
        return None
    try:
        return ahead.future.result()
    except Exception:
        return None


@contextmanager
def _named(url: str, missing: str) -> Iterator[None]:
    """A store's errors as ours, naming `url`: FileNotFoundError (`missing`), access
    denied (loader.storage.store_errors), a known store error; others as raised."""
    try:
        yield
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(url)}: {missing}") from None
    except PermissionError as e:
        raise denied(url, e) from None
    except Exception as e:
        known = store_error(url, e)
        if known is None:
            raise
        raise known from None


def list_files(
    url: str,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[FileEntry]:
    """Files under a directory or prefix (recursively), matching a glob, or the file itself,
    sorted by path. URLs are as the source names them: the source, then the path below
    it. Raises FileNotFoundError naming the URL when nothing is there. `progress(n)` is
    told how many files were listed so far (per page on S3)."""
    fs, path = filesystem(url, storage_options)
    fs.invalidate_cache(path)  # s3fs keeps listings: a new index must see the bucket now
    with _named(url, "no such file, directory or prefix"):
        if fsspec.core.has_magic(path):
            with trip_to(fs):
                infos = list(fs.glob(path, detail=True).values())
            root, given = _root(path), _root(url)
        elif is_object_store(fs):  # list at once: an isdir first is one more round trip
            ahead = _listed_ahead(url, fs)
            if ahead is None:
                with trip():
                    infos = _find(fs, path, progress)
            else:
                infos = ahead
                if progress is not None:
                    progress(len(infos))
            names = [fs._strip_protocol(i["name"]).rstrip("/") for i in infos]
            if not infos or names == [path.rstrip("/")]:  # none below it: a file, or nothing
                return [file_entry(url, storage_options)]
            root, given = path.rstrip("/"), url.rstrip("/")
        elif fs.isdir(path):
            with trip_to(fs):
                infos = _find(fs, path, progress)
            root, given = path.rstrip("/"), url.rstrip("/")
        else:
            return [file_entry(url, storage_options)]
    entries = []
    for info in _sized(fs, [i for i in infos if i.get("type", "file") == "file"]):
        name = fs._strip_protocol(info["name"])
        rel = name[len(root) :].lstrip("/") if name.startswith(root) else name
        shown = f"{given}/{rel}" if given else rel
        entries.append(FileEntry(shown, int(info["size"]), version_of(fs, info), rel))
    return sorted(entries, key=lambda e: e.relpath)


def _sized(fs: Any, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The infos, each with its size and version: an HTTP listing (links on an index page)
    gives neither, so each file's are asked (a HEAD each, concurrently)."""
    if not infos or not is_http(fs):
        return infos

    async def all_infos() -> list[dict[str, Any]]:
        gate = asyncio.Semaphore(HTTP_CONCURRENCY)

        async def one(info: dict[str, Any]) -> dict[str, Any]:
            async with gate, trip():
                got: dict[str, Any] = await fs._info(info["name"])
            if got.get("size") is None:
                raise ValueError(
                    f"{redact(info['name'])}: the server gives no size for this file "
                    "(no Content-Length): shardstream needs it to read by ranges"
                )
            return {**info, **got, "name": info["name"]}

        return list(await asyncio.gather(*(one(i) for i in infos)))

    out: list[dict[str, Any]] = sync(fs.loop, all_infos)
    return out


def file_entry(url: str, storage_options: dict[str, Any] | None = None) -> FileEntry:
    """Size and version of one file named by the user (its URL as given, no relpath);
    FileNotFoundError naming it when missing."""
    fs, path = filesystem(url, storage_options)
    fs.invalidate_cache(path)
    with _named(url, "shard not found"), trip_to(fs):
        return entry_of(fs, fs.info(path), url)
