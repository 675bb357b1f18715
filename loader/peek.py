"""`head(n)` and `take(n)`: a look at the start of an epoch, without touching the dataset's
own pass, position or warnings.

Both read from a copy of the dataset (the same index, sampler and options) with its own
epoch state, its position at the start of the epoch (a loaded resume state is not
applied), and a memory budget of 0: the reader holds one read group ahead at a time, so a
look at a few records reads the groups they lie in and little more; the reading stops
when the look is done.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from shardstream.sampler.checks import as_int

__all__ = ["head", "take"]


def _copy(ds: Any) -> Any:
    """`ds` with its own epoch state at `ds`'s epoch, at the epoch's start."""
    other = copy.copy(ds)
    other._start_epochs()
    other._state.select(ds.epoch)
    other.sampler = copy.copy(ds.sampler)
    other.memory_budget = 0
    return other


def _first(other: Any, n: int) -> list[Any]:
    items = iter(other)
    try:
        return list(itertools.islice(items, n))
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def head(ds: Any, n: Any) -> list[Any]:
    """The first `n` items (records, or batches with batch_size, or blocks with pack) this
    rank yields in the current epoch's order, transformed as iteration gives them."""
    return _first(_copy(ds), as_int("n", n, 0))


def take(ds: Any, n: Any) -> list[dict[str, Any]]:
    """The first `n` records this rank reads in the current epoch's order, as dicts (as
    Arrow's to_pylist gives them; tar samples as webdataset's), before `transform`: a
    dataset of batches is looked at record by record. ValueError with pack= (its items are
    blocks of tokens: use head)."""
    n = as_int("n", n, 0)
    if getattr(ds, "packings", None):
        raise ValueError("take(n) gives records; with pack= the items are blocks: use head(n)")
    other = _copy(ds)
    other.batch_size, other.transform, other.pad = None, None, {}
    if hasattr(other, "kinds_per_stream"):  # a mixture: each stream's records
        other.kinds_per_stream = [None] * len(other.kinds_per_stream)
    else:
        other.kinds, other.batch_format = None, "torch"
    return _first(other, n)
