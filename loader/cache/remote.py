"""The node cache's checks of shards against the remote: a shard served from the cache must
still be its indexed version there, as an uncached read would find (loader.cache.node).

A reading checks each shard it serves from the cache once. A reading that knows its shards
(`ahead`) starts all their checks at once, on a pool of CHECKS threads kept by the process,
and reads and decodes meanwhile: the reader hands out no row of a shard before its check
has passed (loader.read.readahead asks `NodeCache.confirm` for each group). Other reads
check a shard before the cache serves its first bytes. Where several shards of one folder are
checked, one listing of the folder answers for all of them (sizes and versions: S3's and
Azure's ETag, GCS's generation) instead of a metadata request each, when it costs less:
measured on S3 (moto), a HEAD costs ~2.4 ms of CPU, a listing ~5 ms and ~0.1 ms an entry;
the folder is taken to hold at most the index's shards (a folder shared with many other
objects makes the listing the slower choice). A shard missing from the listing is asked
for by itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any

from ..errors import STALE, StaleIndexError
from ..stats import current
from ..storage.filesystems import (
    Indexed,
    entry_of,
    is_object_store,
    stale_now,
    stale_reason,
)
from ..storage.trips import trip

__all__ = ["CHECKS", "RemoteChecks", "listing_pays"]

CHECKS = 8  # threads checking shards against the remote at once (a process's pool)
HEAD_ENTRIES = 25  # entries a listing reads for the CPU of one metadata request
LISTING = 2  # a listing's own cost, in metadata requests

_pool: tuple[int, futures.ThreadPoolExecutor] | None = None  # (pid, pool): none across fork
_pool_lock = threading.Lock()


def _checks_pool() -> futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), futures.ThreadPoolExecutor(CHECKS, "cache-check"))
        return _pool[1]


def listing_pays(checked: int, shards: int) -> bool:
    """Whether one listing of a folder costs less than `checked` metadata requests, for a
    folder of at most `shards` entries."""
    return LISTING + shards / HEAD_ENTRIES < checked


Reasons = dict[str, str | None]  # shard url -> why it is stale (None: it is not)
Answer = tuple[Reasons, int]  # and the requests made for them
Key = tuple[str, str | None]  # (url, version)


class RemoteChecks:
    """The shards (by url and version) a reading has checked against the remote, and the
    checks it started ahead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked: set[Key] = set()
        self._ahead: dict[Key, futures.Future[Answer]] = {}
        self._counted: set[futures.Future[Answer]] = set()  # whose requests are counted

    def started(self, url: str, version: str | None) -> bool:
        """Whether the shard's check is done or was started ahead (`ahead`)."""
        key = (url, version)
        return key in self._checked or key in self._ahead

    def check(self, fs: Any, url: str, indexed: Indexed) -> None:
        """StaleIndexError if the shard is no longer its indexed version on the remote:
        checked now, or by the check started ahead (waited for); nothing if it passed
        before, in this reading. The requests made count in the thread's stats."""
        key = (url, indexed[1])
        if key in self._checked:
            return
        with self._lock:
            ahead = self._ahead.get(key)
        if ahead is None:
            reasons, made = _heads(fs, [(url, indexed)])
        else:
            reasons, made = ahead.result()
            with self._lock:  # one listing answers for several shards: counted once
                if ahead in self._counted:
                    made = 0
                self._counted.add(ahead)
        current().add("requests", made)
        reason = reasons.get(url)
        if reason:
            raise StaleIndexError(f"{reason}: {STALE}")
        with self._lock:
            self._checked.add(key)
            self._ahead.pop(key, None)

    def ahead(self, fs: Any, urls: Sequence[str], indexed: Sequence[Indexed], shards: int) -> None:
        """Start the checks of these shards now, all at once, rather than one round trip
        each as their first cached reads come. `shards`: the index's number of shards
        (what a folder's listing may have to read)."""
        folders: dict[str, list[tuple[str, Indexed]]] = {}
        with self._lock:
            for url, got in zip(urls, indexed):
                if not self.started(url, got[1]):
                    folders.setdefault(url.rpartition("/")[0], []).append((url, got))
        pool, started = _checks_pool(), {}
        for folder, todo in folders.items():
            if is_object_store(fs) and listing_pays(len(todo), shards):
                job = pool.submit(_listed, fs, folder, todo)
                started.update({(url, got[1]): job for url, got in todo})
            else:
                for url, got in todo:
                    started[(url, got[1])] = pool.submit(_heads, fs, [(url, got)])
        with self._lock:
            self._ahead.update(started)


def _heads(fs: Any, todo: list[tuple[str, Indexed]]) -> Answer:
    """Why each shard is stale (None: it is not), one metadata request each."""
    return {url: stale_now(fs, url, *indexed) for url, indexed in todo}, len(todo)


def _listed(fs: Any, folder: str, todo: list[tuple[str, Indexed]]) -> Answer:
    """Why each shard of `folder` is stale (None: it is not), from one listing of it; a
    shard the listing does not show is asked for by itself."""
    path = fs._strip_protocol(folder)
    fs.invalidate_cache(path)
    try:
        with trip():
            listed = {info["name"].rstrip("/"): info for info in fs.ls(path, detail=True)}
    except FileNotFoundError:
        listed = {}
    out: Reasons = {}
    unseen = []
    for url, (size, version) in todo:
        info = listed.get(fs._strip_protocol(url))
        if info is None or info.get("type") == "directory":
            unseen.append((url, (size, version)))
            continue
        out[url] = stale_reason(url, size, version, entry_of(fs, info, url))
    asked, made = _heads(fs, unseen)
    return {**out, **asked}, 1 + made
