"""A mixture's arguments, checked: names, shard sizes, weights, and the streams' seeds.

Each check raises ValueError quoting the stream's name and the bad value.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..keyed import derive_key
from ..shard_sampler import HasShardSizes, sizes_of

__all__ = [
    "Shards",
    "check_names",
    "check_schedule",
    "check_streams",
    "check_weights",
    "schedule_key",
    "stream_seed",
    "stream_sizes",
]

I64Array = npt.NDArray[np.int64]
Shards = Sequence[int] | HasShardSizes | npt.ArrayLike
# phases: (items of the epoch across ranks, a weight per stream), in order
Schedule = tuple[tuple[int, tuple[int | float, ...]], ...]

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


def _weight(w: Any, where: str) -> int | float:
    """A weight of a phase: a finite number >= 0."""
    if isinstance(w, int | np.integer) and not isinstance(w, bool) and w >= 0:
        return int(w)
    if isinstance(w, float | np.floating) and math.isfinite(w) and w >= 0:
        return float(w)
    raise ValueError(f"{where} must be a finite number >= 0, got {w!r}")


def check_schedule(schedule: Any, names: list[str], epoch_size: Any) -> Schedule | None:
    """A schedule ``[(items, weights), ...]`` checked: items ints >= 1 adding up to
    `epoch_size` (when given), weights one per stream (a sequence in stream order, or a
    dict by name, streams left out weighing 0), >= 0, at least one > 0 in each phase."""
    if schedule is None:
        return None
    if isinstance(schedule, str | bytes | Mapping) or not isinstance(schedule, Sequence):
        raise ValueError(f"schedule must be a list of (items, weights), got {schedule!r}")
    if not schedule:
        raise ValueError("schedule must hold at least one phase, got []")
    out = []
    for p, phase in enumerate(schedule):
        where = f"schedule[{p}]"
        if not isinstance(phase, Sequence) or isinstance(phase, str) or len(phase) != 2:
            raise ValueError(f"{where} must be a pair (items, weights), got {phase!r}")
        items, weights = phase
        if isinstance(items, bool) or not isinstance(items, int | np.integer) or items < 1:
            raise ValueError(f"{where}: items must be an int >= 1, got {items!r}")
        if isinstance(weights, Mapping):
            unknown = sorted(str(n) for n in set(weights) - set(names))
            if unknown:
                raise ValueError(f"{where} weighs streams {unknown}; the streams are {names}")
            values = [weights.get(n, 0) for n in names]
        elif isinstance(weights, Sequence) and not isinstance(weights, str):
            values = list(weights)
            if len(values) != len(names):
                raise ValueError(f"{where} needs {len(names)} weights, got {values!r}")
        else:
            raise ValueError(f"{where}: weights must be a dict by stream name, got {weights!r}")
        checked = tuple(_weight(w, f"{where} weight of {n!r}") for n, w in zip(names, values))
        if not any(checked):
            raise ValueError(f"{where}: every stream weighs 0; one weight must be > 0")
        out.append((int(items), checked))
    total = sum(e for e, _ in out)
    if epoch_size is not None and total != epoch_size:
        raise ValueError(
            f"the schedule's phases hold {total} items, and epoch_size={epoch_size!r}: "
            "they must be equal (or leave epoch_size out)"
        )
    return tuple(out)


def schedule_key(schedule: Schedule, names: list[str]) -> int:
    """A digest of a schedule (phases' items, weights by stream name), as a state keeps it:
    a state loaded under another key goes on under the new weights."""
    text = json.dumps([[e, dict(zip(names, w))] for e, w in schedule], sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "big")
