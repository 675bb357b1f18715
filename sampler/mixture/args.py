"""A mixture's arguments, checked: names, shard sizes, weights, and the streams' seeds.

Each check raises ValueError quoting the stream's name and the bad value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..keyed import derive_key
from ..shard_sampler import HasShardSizes, sizes_of

__all__ = [
    "Shards",
    "check_names",
    "check_streams",
    "check_weights",
    "stream_seed",
    "stream_sizes",
]

I64Array = npt.NDArray[np.int64]
Shards = Sequence[int] | HasShardSizes | npt.ArrayLike

TAG_STREAM = 5  # keys a stream's seed; epoch.py and plan.py use tags 1-3


def stream_seed(seed: int, name: str) -> int:
    """The seed of stream `name`: keyed by the name's UTF-8 bytes, never by list position
    or Python's salted hash(), so reordering the streams changes no stream's records."""
    data = name.encode("utf-8")
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]
    return derive_key(seed, TAG_STREAM, len(data), *words)


def check_names(names: Sequence[str] | None, count: int) -> list[str]:
    if names is None:
        return [f"stream{k}" for k in range(count)]
    names = list(names)
    if len(names) != count or not all(isinstance(n, str) for n in names):
        raise ValueError(f"names must be {count} strings, one per stream, got {names!r}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"stream names must be unique; repeated: {dupes}")
    return names


def stream_sizes(shards: Shards, name: str) -> I64Array:
    try:
        return sizes_of(shards)
    except ValueError as e:
        raise ValueError(f"stream {name!r}: {e}") from e


def check_weights(
    weights: Sequence[float] | None, records: list[int], names: list[str]
) -> list[int | float]:
    if weights is None:
        return list(records)
    values = list(weights)
    if len(values) != len(records):
        raise ValueError(f"need {len(records)} weights, one per stream, got {values!r}")
    out: list[int | float] = []
    for name, w in zip(names, values):
        if isinstance(w, int | np.integer) and not isinstance(w, bool) and w > 0:
            out.append(int(w))
        elif isinstance(w, float | np.floating) and math.isfinite(w) and w > 0:
            out.append(float(w))
        else:
            raise ValueError(f"weight of stream {name!r} must be finite and > 0, got {w!r}")
    return out


def check_streams(names: list[str], records: list[int], num_replicas: int, drop_last: bool) -> None:
    """Every stream can fill its ranks' spans: with drop_last at least one record per rank,
    without it at least one record to pad from."""
    for name, n in zip(names, records):
        if drop_last and n < num_replicas:
            raise ValueError(
                f"stream {name!r} has {n} records, fewer than num_replicas="
                f"{num_replicas}: with drop_last each rank's span of it would be empty"
            )
        if n == 0:
            raise ValueError(f"stream {name!r} has 0 records: nothing to read or pad from")
