"""Where a rank stands in one stream of a mixture: passes, their cuts over ranks, cursors.

A stream is read as an endless run of passes; pass p is one epoch of a one-stream
ShardSampler (epoch p). A pass is *cut* over the ranks of a job: rank r reads its span,
``rank_length(N, R, drop_last)`` records. An elastic resume *recuts* the current pass:
every rank of the old layout had consumed the same number s of its span, the rest of each
span is laid end to end (old rank by rank) and cut into equal contiguous spans over the
new ranks (with drop_last the last fewer-than-R' records are left out, without it the last
span pads by wrapping to the start of that rest), as `sampler.resume.continue_streams` does.
A pass recut several times keeps the chain of its earlier layouts, ``recut``: the pairs
(ranks, records each had consumed), oldest first. All arithmetic here is O(1) per layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..epoch import rank_length

__all__ = ["Cursor", "advance", "cut_lengths", "recut", "to_first_cut"]

# (rank of the pass's first cut, first record, end record) of that rank's span
Span = tuple[int, int, int]


@dataclass(frozen=True)
class Cursor:
    """A rank's place in a stream: `consumed` records of its span of pass `pass_index`, as
    that pass is cut now, for `num_replicas` ranks after the earlier layouts `recut`.

    Normalized: `consumed` is less than the span's length (a finished span is the start of
    the next pass, cut afresh for `num_replicas`). Identical on every rank of a job.
    """

    pass_index: int
    consumed: int
    num_replicas: int
    recut: tuple[tuple[int, int], ...] = ()  # earlier layouts: (ranks, consumed by each)


def _rest_length(total: int, num_replicas: int, drop_last: bool) -> int:
    return total // num_replicas if drop_last else -(-total // num_replicas)


def cut_lengths(num_records: int, drop_last: bool, cursor: Cursor) -> list[int]:
    """Span length of each layout of the cursor's pass, oldest first, current last."""
    layouts = [r for r, _ in cursor.recut] + [cursor.num_replicas]
    lengths = [rank_length(num_records, layouts[0], drop_last)]
    for (ranks, consumed), new in zip(cursor.recut, layouts[1:]):
        lengths.append(_rest_length(ranks * (lengths[-1] - consumed), new, drop_last))
    return lengths


def advance(cursor: Cursor, records: int, num_records: int, drop_last: bool) -> Cursor:
    """The cursor `records` further on, normalized; later passes are cut afresh for the
    cursor's ranks. O(recuts), however many passes it skips."""
    left = cut_lengths(num_records, drop_last, cursor)[-1] - cursor.consumed
    if records < left:
        return replace(cursor, consumed=cursor.consumed + records)
    full = rank_length(num_records, cursor.num_replicas, drop_last)
    skip, consumed = divmod(records - left, full)
    return Cursor(cursor.pass_index + 1 + skip, consumed, cursor.num_replicas)


def recut(cursor: Cursor, num_replicas: int, num_records: int, drop_last: bool) -> Cursor:
    """The cursor after an elastic resume to `num_replicas` ranks: the rest of the current
    pass cut over the new ranks. A pass nobody started is cut afresh; a rest too short to
    give every new rank a record (drop_last) is left out, and the next pass starts."""
    if cursor.consumed == 0 and not cursor.recut:
        return Cursor(cursor.pass_index, 0, num_replicas)
    chain = (*cursor.recut, (cursor.num_replicas, cursor.consumed))
    moved = Cursor(cursor.pass_index, 0, num_replicas, chain)
    return advance(moved, 0, num_records, drop_last)


def to_first_cut(lengths: list[int], cursor: Cursor, rank: int, lo: int, hi: int) -> list[Span]:
    """Records [lo, hi) of `rank`'s span in the current layout of the cursor's pass, as
    (rank, lo, hi) ranges of spans of the pass's first cut, in reading order."""
    return _down(lengths, cursor.recut, len(cursor.recut), rank, lo, hi)


def _down(
    lengths: list[int], chain: tuple[tuple[int, int], ...], level: int, rank: int, lo: int, hi: int
) -> list[Span]:
    if lo >= hi:
        return []
    if level == 0:
        return [(rank, lo, hi)]
    ranks, consumed = chain[level - 1]
    rest = lengths[level - 1] - consumed  # records each rank of the layout below left
    total = ranks * rest  # the rest laid end to end; positions past it wrap (padding)
    out: list[Span] = []
    pos, end = rank * lengths[level] + lo, rank * lengths[level] + hi
    while pos < end:
        q = pos if pos < total else (pos - total) % total
        below, offset = divmod(q, rest)
        take = min(end - pos, rest - offset)
        first = consumed + offset
        out += _down(lengths, chain, level - 1, below, first, first + take)
        pos += take
    return out
