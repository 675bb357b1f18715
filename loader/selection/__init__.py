"""Selecting a dataset's records: `filter=` (a pyarrow expression) and `split=` (a seeded
fraction), as a *selected index* the sampler plans over.

Which records are selected is decided once, before reading, so every guarantee of the
loader holds for them: `len` exact, equal counts per rank, each selected record once an
epoch, resume from a few integers. A selected index (`view.selected_index`) is the index
with, per shard, the storage rows that are records (loader.formats.selected reads them);
a row group holding none is never fetched.

    filtering   which rows of each shard pass a filter: row groups whose statistics
                exclude it are skipped, the others' filter columns read once; kept in the
                index as ``filter:<expression>`` (saved with it)
    split       which of a shard's records fall in a split's fraction (keyed by the seed)
    view        the selected index itself
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import Format
from ..index.shard_index import ShardIndex
from ..storage.retry import RetryPolicy
from .filtering import check_filter, passing_rows
from .split import Split, check_split, split_rows
from .view import selected_index

__all__ = ["Split", "check_filter", "check_split", "select"]


def select(
    index: ShardIndex,
    fmt: Format,
    filter: Any = None,
    split: object = None,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> ShardIndex:
    """`index` itself when neither `filter` nor `split` is given; else the selected index of
    the records passing `filter` (evaluated once and kept in `index`'s table) and, of those,
    the ones `split` takes (both checked: `check_filter`, `check_split`). ValueError for
    tar shards (records without columns) and for shards the index only counted (a
    manifest's)."""
    filter, split = check_filter(filter), check_split(split)
    if filter is None and split is None:
        return index
    if index.format == "tar":
        raise ValueError(
            "filter= and split= select rows of Parquet or Arrow IPC shards; these are tar "
            "shards: select them by their list of files (or their keys, in transform=)"
        )
    if "deferred" in index.table.column_names and index.table.column("deferred").null_count < len(
        index
    ):
        raise ValueError(
            "filter= and split= need each shard's row groups, and this index only counted "
            "some shards (a manifest's or list's counts): index the shards themselves"
        )
    sizes = index.shard_sizes
    rows: list[np.ndarray] = (
        passing_rows(index, fmt, filter, storage_options, retry)
        if filter is not None
        else [np.arange(n, dtype=np.int64) for n in sizes]
    )
    if split is not None:
        rows = [r[split_rows(len(r), split, seed, s)] for s, r in enumerate(rows)]
    return selected_index(index, rows)
