"""wids shard lists beside tar shards: record counts without reading the shards.

A wids shard list (webdataset's wids; ``widsindex create`` writes ``shardindex.json``)::

    {"__kind__": "wids-shard-index-v1", "wids_version": 1,
     "shardlist": [{"url": "shard-000000.tar", "nsamples": 10000, "filesize": 123456}, ...]}

Its URLs are relative to its folder (or its ``"base"``). It gives record counts but no
member offsets: its shards are planned from the counts and indexed when a reader first
opens them (loader.formats.deferred). A ``filesize`` other than the shard's size raises
StaleSidecarError naming both; so does a count the shard does not hold, when it is read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...errors import StaleSidecarError
from ...storage.filesystems import FileEntry, redact
from ...storage.retry import RetryPolicy, read_ranges
from ...storage.urls import is_relative, normalize_url

__all__ = ["WidsCount", "check_wids", "read_wids"]

_PROBE = 4096  # bytes read from a JSON file's start to tell a wids list from other JSON
_MAX_PROBES = 16  # JSON files beside the shards looked at, at most


def _join(base: str, url: str) -> str:
    if not base or not is_relative(url):
        return normalize_url(url)
    return normalize_url(f"{base.rstrip('/')}/{url}")


WidsCount = tuple[int, int | None, str]  # records, file size (if listed), the list's URL


def read_wids(fs: Any, companions: Sequence[FileEntry], retry: RetryPolicy) -> dict[str, WidsCount]:
    """Record counts by shard URL (normalized) from the wids shard lists among the JSON
    files at the top of the listing: the first `_MAX_PROBES` are each recognized from
    their first 4 KiB; only wids lists are read whole. A wids list that is not valid
    raises StaleSidecarError naming it."""
    roots = sorted(
        (c for c in companions if c.url.lower().endswith(".json") and "/" not in c.relpath),
        key=lambda c: c.url,
    )[:_MAX_PROBES]
    if not roots:
        return {}
    indexed = [(c.size, c.version) for c in roots]
    heads = read_ranges(
        fs,
        [c.url for c in roots],
        [0] * len(roots),
        [min(c.size, _PROBE) for c in roots],
        retry,
        indexed,
    )
    lists = [(c, i) for c, i, h in zip(roots, indexed, heads) if b"wids" in h and b"shardlist" in h]
    if not lists:
        return {}
    docs = read_ranges(
        fs,
        [c.url for c, _ in lists],
        [0] * len(lists),
        [c.size for c, _ in lists],
        retry,
        [i for _, i in lists],
    )
    counts: dict[str, WidsCount] = {}
    for (c, _), raw in zip(lists, docs):
        for url, n, size in _wids_shards(raw, c.url):
            counts[url] = (n, size, c.url)
    return counts


def _wids_shards(raw: bytes, where: str) -> list[tuple[str, int, int | None]]:
    """(normalized URL, nsamples, filesize or None) of each shard a wids list names."""
    try:
        doc = json.loads(raw)
        base = doc.get("base") or (where.rsplit("/", 1)[0] if "/" in where else "")
        out = []
        for s in doc["shardlist"]:
            n, size = s["nsamples"], s.get("filesize")
            if not isinstance(n, int) or n < 0 or not (size is None or isinstance(size, int)):
                raise ValueError(f"bad nsamples {n!r} or filesize {size!r} for {s['url']}")
            out.append((_join(str(base), str(s["url"])), n, size))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StaleSidecarError(
            f"{redact(where)}: not a valid wids shard list ({type(e).__name__}: {e}); fix it or "
            "remove it"
        ) from None


def check_wids(entry: FileEntry, count: WidsCount) -> None:
    """StaleSidecarError when the wids list gives the shard another size than it has."""
    n, size, where = count
    if size is not None and size != entry.size:
        raise StaleSidecarError(
            f"{redact(where)}: lists {redact(entry.url)} with filesize {size} and {n} records, "
            f"the shard has {entry.size} bytes; the list is stale: rebuild it (widsindex "
            "create) or remove it"
        )
