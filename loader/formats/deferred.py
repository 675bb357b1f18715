"""Deferred shards: indexed by their reader, when first opened.

A manifest or a wids shard list gives a shard's record count without its layout (Parquet
row groups, tar member offsets). Planning needs only the count, so the index leaves the
layout out (``details == {"deferred": <the manifest or list>}``) and the reader scans the
shard the first time it reads it in a process: a Parquet footer (which a reader fetches
anyway), or a tar's headers. The layout is kept per process, keyed by the shard's URL,
size and version. A scan that finds another record count than the index's raises
StaleSidecarError naming the manifest or list.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from ..errors import StaleSidecarError
from ..shard import Shard
from ..storage.filesystems import FileEntry, redact
from .tar.members import members_of

__all__ = ["complete", "estimated_bytes", "is_deferred"]

CACHED = 256  # shard layouts kept per process (a reader opens a few shards at a time)

_layouts: OrderedDict[tuple[str, int, str | None], dict[str, Any]] = OrderedDict()
_locks: dict[tuple[str, int, str | None], threading.Lock] = {}
_guard = threading.Lock()


def is_deferred(shard: Shard) -> bool:
    return "deferred" in shard.details


def estimated_bytes(shard: Shard, start: int, stop: int) -> int:
    """Bytes a read of records [start, stop) of a deferred shard fetches, supposing its
    records are of equal size (for a compressed tar: from its start)."""
    if start >= stop or shard.num_records <= 0:
        return 0
    first = 0 if shard.url.lower().endswith((".tar.gz", ".tgz")) else start
    return shard.bytes * (stop - first) // shard.num_records


def complete(fmt: Any, fs: Any, shard: Shard) -> Shard:
    """The shard with its layout: as it is, or scanned by `fmt` (once per process, even
    when reader threads ask for it at the same time)."""
    if not is_deferred(shard):
        return shard
    key = (shard.url, shard.bytes, shard.version)
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        with _guard:
            details = _layouts.get(key)
            if details is not None:
                _layouts.move_to_end(key)
        if details is None:
            details = _scan(fmt, fs, shard)
            with _guard:
                _layouts[key] = details
                while len(_layouts) > CACHED:
                    _locks.pop(_layouts.popitem(last=False)[0], None)
    # what the index itself knew of the shard (its Hive partition values) stays
    kept = {k: v for k, v in shard.details.items() if k != "deferred"}
    return replace(shard, details={**details, **kept})


def _scan(fmt: Any, fs: Any, shard: Shard) -> dict[str, Any]:
    (got,) = fmt.scan(fs, [FileEntry(shard.url, shard.bytes, shard.version)])
    if int(got["num_records"]) != shard.num_records:
        raise StaleSidecarError(
            f"{redact(str(shard.details['deferred']))}: gives {shard.num_records} records for "
            f"{redact(shard.url)}, the shard holds {got['num_records']}; it is stale: rebuild "
            "it (and the index made from it) or remove it"
        )
    details: dict[str, Any] = got["details"]
    if "members" in details:  # a tar's member table as arrays, once, not on every read
        members_of(details)
    return details
