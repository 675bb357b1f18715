"""`split=(start, stop)`: a seeded fraction of each shard's records.

In each shard, the records (those passing a filter, when there is one) are ranked by the
keyed permutation of their positions (sampler.keyed, keyed by the seed and the shard's
place in the index); a split of fractions [start, stop) takes ranks [b(start), b(stop)),
where b(x) = floor(x * m + u) for a shard of m records and a keyed u in [0, 1) of the
shard. Adjacent splits share their boundary, so they are disjoint and cover every record;
a split holds (stop - start) * m records of each shard within one, and in expectation
exactly; it depends on the seed, the shard and the record alone: the same for any number
of ranks, workers or epochs.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from shardstream.sampler.keyed import derive_key, permute, unit_floats

__all__ = ["Split", "check_split", "split_rows"]

Split = tuple[float, float]
_TAG = 0x53504C4954  # "SPLIT": keys splits apart from the sampler's shuffles


def check_split(split: object) -> Split | None:
    """`split` as (start, stop) floats with 0 <= start < stop <= 1; None as given;
    TypeError or ValueError naming the value."""
    if split is None:
        return None
    if not isinstance(split, tuple | list) or len(split) != 2:
        raise TypeError(
            f"split must be (start, stop), fractions of the records, e.g. (0, 0.9) for "
            f"training and (0.9, 1) for validation; got {split!r}"
        )
    start, stop = split
    for v in (start, stop):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise TypeError(f"split=({start!r}, {stop!r}): fractions must be numbers")
    if not 0 <= start < stop <= 1:
        raise ValueError(
            f"split=({start!r}, {stop!r}) must satisfy 0 <= start < stop <= 1 (fractions of "
            "the records)"
        )
    return float(start), float(stop)


def split_rows(m: int, split: Split, seed: int, shard: int) -> npt.NDArray[np.bool_]:
    """(m,) which of shard `shard`'s m records (in order) the split takes."""
    if m == 0:
        return np.zeros(0, dtype=bool)
    key = derive_key(seed, _TAG, shard)
    u = float(unit_floats(np.zeros(1, np.int64), key)[0])
    lo, hi = (math.floor(x * m + u) for x in split)
    rank = permute(np.arange(m, dtype=np.int64), m, key)
    mask: npt.NDArray[np.bool_] = (rank >= lo) & (rank < hi)
    return mask
