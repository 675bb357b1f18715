"""A mixture sampler's state: stream cursors as JSON integers, and back, validated.

    {"epoch": e, "position": i,
     "streams": {name: {"pass": p, "consumed": s, "num_replicas": R, "count": c_k,
                        "recut": [{"num_replicas": R0, "consumed": s0}, ...]}}}

"recut" is present only for a pass that elastic resumes cut anew (oldest layout first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .passes import Cursor, cut_lengths

__all__ = ["cursor_state", "load_cursors"]

Loaded = tuple[int, int, tuple[Cursor, ...], tuple[int, ...]]


def cursor_state(cursor: Cursor, count: int) -> dict[str, Any]:
    """One stream's entry of the state: its cursor and the epoch's count."""
    out: dict[str, Any] = {
        "pass": cursor.pass_index,
        "consumed": cursor.consumed,
        "num_replicas": cursor.num_replicas,
        "count": count,
    }
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
    loaded = [
        _cursor(streams[name], n, drop_last, f"state['streams'][{name!r}]")
        for name, n in zip(names, num_records)
    ]
    cursors, counts = tuple(c for c, _ in loaded), tuple(m for _, m in loaded)
    layouts = {c.num_replicas for c in cursors}
    if len(layouts) != 1:
        raise ValueError(f"state streams were cut for different num_replicas: {sorted(layouts)}")
    if position > sum(counts):
        raise ValueError(f"state['position']={position} exceeds the epoch's {sum(counts)} records")
    return epoch, position, cursors, counts
