"""Indexing for shardstream-plan: progress bars for the listing and the scan, worker
processes, sidecars.

`--index-workers N` scans with N processes (the listing is read once, by this process;
see loader.index.distributed.build_parallel). It is not `--workers`, which is the number
of DataLoader workers per rank that the plan is shown for: the two answer different
questions (how fast can I index? how will a job split?) and may both be given.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from shardstream.loader import ShardIndex
from shardstream.loader.formats.tar.idx import write_sidecars
from shardstream.loader.index.distributed import build_parallel
from shardstream.loader.index.shard_index import INDEX_SUFFIXES

__all__ = ["build_index", "check_index_path", "save_sidecars"]


class _Bars:
    """A listing bar (files listed, total unknown) that gives way to an indexing bar."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.listing: Any = tqdm(desc="listing", unit=" files", disable=quiet)
        self.indexing: Any = None

    def listed(self, n: int) -> None:
        self.listing.update(n - self.listing.n)

    def progress(self, done: int, total: int) -> None:
        if self.indexing is None:
            self.listing.close()
            self.indexing = tqdm(
                desc="indexing shards", unit="shard", total=total, disable=self.quiet
            )
        self.indexing.update(done - self.indexing.n)

    def close(self) -> None:
        self.listing.close()
        if self.indexing is not None:
            self.indexing.close()


def check_index_path(path: str) -> None:
    """ValueError unless `path` names a saved index by its suffix (a source ending in one
    of INDEX_SUFFIXES is loaded as a saved index, anything else is indexed as data)."""
    if not path.endswith(INDEX_SUFFIXES):
        raise ValueError(
            f"--save-index {path}: name it *.index.arrow (an Arrow IPC file) or *.json (JSON); "
            "a source is taken as a saved index by these suffixes only"
        )


def build_index(
    source: str | list[str],
    options: dict[str, Any] | None,
    workers: int = 1,
    sidecars: bool = True,
    quiet: bool = False,
) -> ShardIndex:
    """A saved index as it is, or the index of `source` (a source, or a list of sources
    planned as one dataset) built with `workers` processes, with progress bars on stderr
    unless `quiet`."""
    if isinstance(source, str) and source.endswith(INDEX_SUFFIXES):
        return ShardIndex.load(source, options)
    bars = _Bars(quiet)
    try:
        return build_parallel(
            source, options, workers, progress=bars.progress, listed=bars.listed, sidecars=sidecars
        )
    finally:
        bars.close()


def save_sidecars(index: ShardIndex, options: dict[str, Any] | None, quiet: bool) -> int:
    """Write DALI .idx sidecars beside the index's plain tar shards; say how many."""
    if index.format != "tar":
        raise ValueError("--write-sidecars writes tar index sidecars: this dataset is not tar")
    written = write_sidecars(index.shards, options)
    if not quiet:
        print(f"wrote {written:,} .idx sidecars beside the tar shards", file=sys.stderr)
    return written
