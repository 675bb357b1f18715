"""New weights at a checkpoint: the rest of an epoch planned under another schedule.

An epoch's plan gives stream k the records [0, c_k) of its sequence, counted from the
epoch's cursor. A state loaded into a mixture with other weights (another `schedule`)
keeps what the positions already read took: `consumed`, ranges of the epoch's positions
(one per DataLoader worker). The rest of the epoch, from the rank's next item on, is
planned under the new schedule: its phases from that item to the epoch's end. Stream k
then reads, in order, the records of its sequence that no read position took (its
*holes*), then the records after the old plan's end. Holes the new counts do not reach
this epoch come first in the next (`drop`), so each record of a pass is read once.

A *map* says which offsets of the cursor's sequence an epoch reads, in order: intervals
[a, b), the last one open (b = OPEN). ``IDENTITY = ((0, OPEN),)`` reads the sequence as it
comes. The intervals are sorted and disjoint, and the open one starts after every other.
"""

from __future__ import annotations

from collections.abc import Sequence

from .phases import Phases

__all__ = [
    "IDENTITY",
    "OPEN",
    "Map",
    "after_epochs",
    "drop",
    "end_after",
    "normal",
    "reweigh",
    "through",
]

OPEN = -1
Map = tuple[tuple[int, int], ...]
IDENTITY: Map = ((0, OPEN),)


def through(m: Map, x0: int, x1: int) -> list[tuple[int, int]]:
    """Records [x0, x1) of an epoch reading by map `m`, as intervals of the sequence."""
    out, pos = [], 0
    for a, b in m:
        n = b - a if b != OPEN else max(0, x1 - pos)
        lo, hi = max(x0, pos), min(x1, pos + n)
        if lo < hi:
            out.append((a + lo - pos, a + hi - pos))
        pos += n
        if pos >= x1:
            break
    return out


def end_after(m: Map, count: int) -> int:
    """Where the next epoch's sequence starts after an epoch read `count` records by
    `m`: past the last record read, and at least at the open interval's start."""
    closed = sum(b - a for a, b in m[:-1])
    return m[-1][0] + max(0, count - closed)


def drop(m: Map, count: int) -> Map:
    """What a map reads after its first `count` records: the next epoch's map."""
    out, pos = [], 0
    for a, b in m[:-1]:
        if count < pos + b - a:
            out.append((a + max(0, count - pos), b))
        pos += b - a
    return (*out, (end_after(m, count), OPEN))


def normal(m: Map) -> tuple[int, Map]:
    """(shift, map): the map counted from its first offset, which the cursor moves to."""
    shift = m[0][0]
    return shift, tuple((a - shift, b if b == OPEN else b - shift) for a, b in m)


def after_epochs(m: Map, first: int, count: int, epochs: int) -> tuple[int, Map]:
    """(shift of the cursor, map) of the epoch `epochs` after one that read `first`
    records by `m`, each epoch between reading `count`: holes left are read first, then
    the sequence goes on in closed form."""
    m, left = drop(m, first), epochs - 1
    while left and len(m) > 1 and count:
        m, left = drop(m, count), left - 1
    if len(m) == 1:
        m = ((m[0][0] + left * count, OPEN),)
    return normal(m)


def _compose(outer: Map, inner: Map) -> Map:
    """The map reading `inner`'s offsets of the sequence `outer` reads."""
    out: list[tuple[int, int]] = []
    closed = sum(b - a for a, b in outer[:-1])
    for a, b in inner[:-1]:
        out += through(outer, a, b)
    start = inner[-1][0]  # the open tail: outer's intervals from `start` on, then its open one
    out += through(outer, start, max(start, closed))
    out.append((end_after(outer, start), OPEN))
    return tuple((a, b) for a, b in out if b == OPEN or a < b)


def reweigh(
    phases: Phases,
    maps: Sequence[Map],
    ranks: Sequence[int],
    consumed: Sequence[tuple[int, int]],
) -> list[Map]:
    """Each stream's map for the rest of an epoch of `phases` (read by `maps`) after its
    positions `consumed` were read: the holes they left, then what follows the epoch."""
    out = []
    for k, (m, count) in enumerate(zip(maps, phases.totals)):
        taken = sorted(
            (phases.before(ranks, p0)[k], phases.before(ranks, p1)[k]) for p0, p1 in consumed
        )
        holes, pos = [], 0
        for a, b in taken:
            if pos < a:
                holes.append((pos, a))
            pos = max(pos, b)
        if pos < count:
            holes.append((pos, count))
        out.append(_compose(m, (*holes, (count, OPEN))))
    return out
