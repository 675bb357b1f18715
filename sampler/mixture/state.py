"""A mixture sampler's state: stream cursors as JSON integers, and back, validated.

    {"epoch": e, "position": i,
     "streams": {name: {"pass": p, "consumed": s, "num_replicas": R, "count": c_k,
                        "phases": [c_k1, c_k2, ...], "map": [[a, b], ..., [a, -1]],
                        "records": N_k,
                        "recut": [{"num_replicas": R0, "consumed": s0}, ...]}}}

"recut" is present only for a pass that elastic resumes cut anew (oldest layout first);
"phases" only for an epoch of several phases (a schedule): the stream's count in each;
"map" only for an epoch resumed under new weights (sampler.mixture.reweight); "records",
the stream's record count, to refuse a state of another source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .passes import Cursor, cut_lengths
from .phases import Phases
from .reweight import IDENTITY, OPEN, Map

__all__ = ["cursor_state", "load_cursors"]

Loaded = tuple[int, int, tuple[Cursor, ...], Phases, tuple[Map, ...]]


def cursor_state(
    cursor: Cursor,
    count: int,
    phases: Sequence[int] = (),
    reads: Map = IDENTITY,
    records: int | None = None,
) -> dict[str, Any]:
    """One stream's entry of the state: its cursor and the epoch's count (and, over
    several phases, its count in each; resumed under new weights, the map it reads by;
    the stream's record count)."""
    out: dict[str, Any] = {
        "pass": cursor.pass_index,
        "consumed": cursor.consumed,
        "num_replicas": cursor.num_replicas,
        "count": count,
    }
    if len(phases) > 1:
        out["phases"] = [int(c) for c in phases]
    if reads != IDENTITY:
        out["map"] = [[a, b] for a, b in reads]
    if records is not None:
        out["records"] = int(records)
    if cursor.recut:
        out["recut"] = [{"num_replicas": r, "consumed": s} for r, s in cursor.recut]
    return out


def _int(mapping: Any, key: str, minimum: int, where: str) -> int:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise ValueError(f"{where} must be a dict with key {key!r}, got {mapping!r}")
    value = mapping[key]
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not ok or value < minimum:
        raise ValueError(f"{where}[{key!r}] must be an int >= {minimum}, got {value!r}")
    return int(value)


def _phases(entry: Any, count: int, where: str) -> list[int]:
    """The stream's count in each phase of the epoch ([count]: one phase)."""
    phases = entry.get("phases", [count])
    if not isinstance(phases, list) or not phases:
        raise ValueError(f"{where}['phases'] must be a non-empty list, got {phases!r}")
    out = [_int({"c": c}, "c", 0, f"{where}['phases'][{i}]") for i, c in enumerate(phases)]
    if sum(out) != count:
        raise ValueError(f"{where}: phases {out} do not add up to its count {count}")
    return out


def _map(entry: Any, where: str) -> Map:
    """The map a stream's epoch reads by (sampler.mixture.reweight), checked."""
    raw = entry.get("map", [list(i) for i in IDENTITY])
    out: list[tuple[int, int]] = []
    ok = isinstance(raw, list) and raw
    for i, pair in enumerate(raw if ok else []):
        last = i == len(raw) - 1
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(x) is int for x in pair)):
            ok = False
            break
        a, b = pair
        ok = ok and a >= (out[-1][1] if out else 0) and (b == OPEN if last else a < b)
        out.append((a, b))
    if not ok:
        raise ValueError(
            f"{where}['map'] must be sorted [a, b] pairs, the last [a, -1]; got {raw!r}"
        )
    return tuple(out)


def _cursor(entry: Any, num_records: int, drop_last: bool, where: str) -> tuple[Cursor, int]:
    chain = entry.get("recut", []) if isinstance(entry, Mapping) else []
    if not isinstance(chain, list):
        raise ValueError(f"{where}['recut'] must be a list, got {chain!r}")
    recut = tuple(
        (_int(c, "num_replicas", 1, f"{where}['recut'][{i}]"),
         _int(c, "consumed", 0, f"{where}['recut'][{i}]"))
        for i, c in enumerate(chain)
    )  # fmt: skip
    cursor = Cursor(
        _int(entry, "pass", 0, where),
        _int(entry, "consumed", 0, where),
        _int(entry, "num_replicas", 1, where),
        recut,
    )
    lengths = cut_lengths(num_records, drop_last, cursor)
    used = [s for _, s in recut] + [cursor.consumed]
    for i, (s, length) in enumerate(zip(used, lengths)):
        if s >= length:
            raise ValueError(
                f"{where}: layout {i} of the pass spans {length} records per rank, so "
                f"{s} consumed is past its end; was the state saved for this stream?"
            )
    return cursor, _int(entry, "count", 0, where)


def load_cursors(
    state: Any, names: Sequence[str], num_records: Sequence[int], drop_last: bool
) -> Loaded:
    """(epoch, position, cursors, counts) of a state, in the order of `names`; ValueError
    naming the bad key and value."""
    epoch = _int(state, "epoch", 0, "state")
    position = _int(state, "position", 0, "state")
    streams = state.get("streams")
    if not isinstance(streams, Mapping):
        raise ValueError(f"state['streams'] must be a dict by stream name, got {streams!r}")
    missing, unknown = set(names) - set(streams), set(streams) - set(names)
    if missing or unknown:
        raise ValueError(
            f"state streams {sorted(streams)} differ from the mixture's {sorted(names)}: "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    for name, n in zip(names, num_records):
        saved = streams[name].get("records", n) if isinstance(streams[name], Mapping) else n
        if saved != n:
            raise ValueError(
                f"state['streams'][{name!r}] was saved for a stream of {saved} records; "
                f"this stream {name!r} has {n}: another source under the same name?"
            )
    loaded = [
        _cursor(streams[name], n, drop_last, f"state['streams'][{name!r}]")
        for name, n in zip(names, num_records)
    ]
    cursors = tuple(c for c, _ in loaded)
    per_stream = [
        _phases(streams[name], m, f"state['streams'][{name!r}]")
        for name, (_, m) in zip(names, loaded)
    ]
    if len({len(p) for p in per_stream}) != 1:
        raise ValueError(f"state streams give different numbers of phases: {per_stream}")
    phases = Phases(tuple(zip(*per_stream)))
    layouts = {c.num_replicas for c in cursors}
    if len(layouts) != 1:
        raise ValueError(f"state streams were cut for different num_replicas: {sorted(layouts)}")
    if position > len(phases):
        raise ValueError(f"state['position']={position} exceeds the epoch's {len(phases)} records")
    maps = tuple(_map(streams[name], f"state['streams'][{name!r}]") for name in names)
    return epoch, position, cursors, phases, maps
