"""Reads through a byte cache: which cache the calling thread's storage reads go through.

A dataset's reader (loader.read.plan_reader) reads each shard inside `reading_shard`;
`loader.storage.retry.read_ranges` asks `current_cache` and, for remote indexed files, reads
through that cache (loader.cache.node.NodeCache) instead of fetching. The slot lives here,
below both, so that storage never imports the cache: the cache is handed in from above.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from .filesystems import Indexed

__all__ = ["ByteCache", "Fetch", "current_cache", "reading_shard"]

# the retrying ranged read a cache calls for the blocks it lacks
Fetch = Callable[[Sequence[str], Sequence[int], Sequence[int], Sequence[Indexed]], list[bytes]]


class ByteCache(Protocol):
    """What storage needs of a cache (loader.cache.node.NodeCache is one)."""

    def read(
        self,
        fs: Any,
        urls: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        indexed: Sequence[Indexed],
        fetch: Fetch,
        shard: int | None = None,
    ) -> list[bytes]:
        """Bytes [starts[i], ends[i]) of urls[i], held ones from the cache, the others
        fetched with `fetch` (and kept)."""
        ...

    def holds(
        self,
        urls: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        indexed: Sequence[Indexed],
    ) -> bool:
        """Whether the cache holds all of bytes [starts[i], ends[i]) of urls[i]."""
        ...

    def check_ahead(
        self, fs: Any, urls: Sequence[str], indexed: Sequence[Indexed], shards: int
    ) -> None:
        """Start checking these shards (of an index of `shards`) against the remote; the
        caller `confirm`s each before handing out its rows (its reads do not wait)."""
        ...

    def confirm(self, fs: Any, url: str, indexed: Indexed) -> None:
        """StaleIndexError if the shard is no longer its indexed version on the remote."""
        ...

    def mapped(self, url: str, indexed: Indexed, end: int) -> Any:
        """The shard's bytes [0, end) as one pyarrow buffer over the cache's own files (a
        memory map), or None: read it through `read`."""
        ...

    def served(self, shard: int, nbytes: int) -> None:
        """`nbytes` of shard `shard` were read from a `mapped` buffer (what `read` would
        have counted and told its plan)."""
        ...


_local = threading.local()


@contextlib.contextmanager
def reading_shard(cache: ByteCache | None, shard: int) -> Iterator[None]:
    """Reads of this thread inside the block go through `cache` (None: not cached), for
    shard `shard` (which the cache's plan knows)."""
    before = getattr(_local, "at", None)
    _local.at = None if cache is None else (cache, shard)
    try:
        yield
    finally:
        _local.at = before


def current_cache() -> tuple[ByteCache, int] | None:
    """(cache, shard) the calling thread reads through, if any (see `reading_shard`)."""
    at: tuple[ByteCache, int] | None = getattr(_local, "at", None)
    return at
