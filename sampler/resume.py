"""Where each DataLoader worker resumes, given how many items the loader delivered.

torch's DataLoader (in order, the default) takes items from its workers in turn, starting
with worker 0: item i comes from the next worker of the cycle among those not exhausted.
So after `consumed` items, worker w has delivered min(n_w, r) items in r full rounds, plus
one if it is among the first workers of the next, partial round; and the next item is due
from some worker c. A new DataLoader starts its cycle at worker 0 again, so on resume
worker w plays the part of worker (c + w) % W: the cycle, and with it the order, goes on
exactly where it stopped. The state a plain DataLoader needs is thus one integer, the count
of items (records or batches) consumed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .epoch import worker_span

__all__ = [
    "Segment",
    "Streams",
    "base_streams",
    "continue_streams",
    "cut_segments",
    "phased_streams",
    "resume_point",
]


def resume_point(counts: Sequence[int], consumed: int) -> tuple[list[int], int]:
    """(items each worker had delivered, the worker due next) when a loader taking items
    round-robin from workers holding `counts` items had delivered `consumed` of them."""
    total = sum(counts)
    if not 0 <= consumed <= total:
        raise ValueError(f"consumed must lie in [0, {total}], got {consumed}")

    def delivered(rounds: int) -> int:
        return sum(min(n, rounds) for n in counts)

    # the most full rounds r with delivered(r) <= consumed (delivered is non-decreasing)
    lo, hi = 0, max(counts, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if delivered(mid) <= consumed:
            lo = mid
        else:
            hi = mid - 1
    # workers still delivering in round lo + 1; the first `extra` of them already did
    active = [w for w, n in enumerate(counts) if n > lo]
    extra = consumed - delivered(lo)
    skips = [min(n, lo) + (1 if w in active[:extra] else 0) for w, n in enumerate(counts)]
    due = active[extra] if extra < len(active) else 0
    return skips, due


# --- elastic resume: the rest of an epoch, laid out for another number of ranks ----------

# (base rank, base worker, first record, end record): records [first, end) of the stream of
# plan(base worker) of base rank, in the job layout the epoch started with
Segment = tuple[int, int, int, int]
# [rank][worker] -> the segments that worker reads, in order
Streams = list[list[list[Segment]]]


def base_streams(length: int, num_replicas: int, num_workers: int, align: int) -> Streams:
    """Each worker reads its own plan whole: the layout of an epoch that was not resumed."""
    workers = max(1, num_workers)
    spans = [worker_span(0, length, w, workers, align) for w in range(workers)]
    return [[[(r, w, 0, hi - lo)] for w, (lo, hi) in enumerate(spans)] for r in range(num_replicas)]


def phased_streams(ends: Sequence[int], num_replicas: int, num_workers: int, align: int) -> Streams:
    """A mixture's epoch of phases ending at positions `ends`, not resumed: each worker
    reads its part of each phase (`worker_span`), in positions of its rank's epoch. A
    DataLoader taking items from its workers in turn so delivers the phases in order."""
    workers = max(1, num_workers)
    parts = [
        [(a + lo, a + hi) for a, b in zip((0, *ends), ends)
         for lo, hi in [worker_span(0, b - a, w, workers, align)] if lo < hi]
        for w in range(workers)
    ]  # fmt: skip
    return [
        [[(r, w, a, b) for a, b in parts[w]] for w in range(workers)] for r in range(num_replicas)
    ]


def _length(segments: list[Segment]) -> int:
    return sum(b - a for _, _, a, b in segments)


def cut_segments(segments: list[Segment], lo: int, hi: int) -> list[Segment]:
    """Records [lo, hi) of the segments laid end to end."""
    out, pos = [], 0
    for r, w, a, b in segments:
        n = b - a
        if pos + n > lo and pos < hi:
            out.append((r, w, a + max(0, lo - pos), a + min(n, hi - pos)))
        pos += n
    return out


def continue_streams(
    streams: Streams,
    item: int,
    consumed: int,
    num_replicas: int,
    num_workers: int,
    align: int,
    drop_last: bool,
    ends: Sequence[int] = (),
) -> Streams:
    """The rest of an epoch for a new job layout.

    In the old layout `streams`, every rank had consumed `consumed` items of `item` records
    (batches; 1 for records) from a DataLoader over its workers. What no rank consumed is
    laid end to end (old rank by rank, worker by worker) and cut into `num_replicas` equal
    contiguous spans, then each span into `num_workers` parts at multiples of `align`.
    Padding follows the dataset's: with drop_last the last (fewer than num_replicas) records
    are left out; without it the line is padded by wrapping to its start.

    `ends`: a mixture's phases (`phased_streams`; segments then hold positions of their
    rank's epoch): the rest of each phase is cut so, one phase after the other, and each
    new worker reads its part of each phase in turn.
    """
    rest: list[Segment] = []
    for rank_streams in streams:
        records = [_length(s) for s in rank_streams]
        skips, _ = resume_point([-(-n // item) for n in records], consumed)
        for segs, n, k in zip(rank_streams, records, skips):
            rest += cut_segments(segs, min(n, k * item), n)
    if len(ends) < 2:
        return _cut(rest, num_replicas, num_workers, align, drop_last)
    phases = [
        [(r, w, max(a, lo), min(b, hi)) for r, w, a, b in rest if max(a, lo) < min(b, hi)]
        for lo, hi in zip((0, *ends), ends)
    ]
    cuts = [_cut(p, num_replicas, num_workers, align, drop_last) for p in phases]
    return [
        [[seg for cut in cuts for seg in cut[r][w]] for w in range(max(1, num_workers))]
        for r in range(num_replicas)
    ]


def _cut(
    rest: list[Segment], num_replicas: int, num_workers: int, align: int, drop_last: bool
) -> Streams:
    """`rest` laid end to end, cut in equal spans over the ranks and each over workers."""
    total = _length(rest)
    length = total // num_replicas if drop_last else -(-total // num_replicas)
    out: Streams = []
    for rank in range(num_replicas):
        lo, hi = rank * length, (rank + 1) * length
        span = cut_segments(rest, lo, min(hi, total))
        pos = max(lo, total)  # padding: wrap to the start of the line
        while pos < hi and total:
            q = (pos - total) % total
            take = min(hi - pos, total - q)
            span += cut_segments(rest, q, q + take)
            pos += take
        parts = [
            worker_span(0, length, w, max(1, num_workers), align)
            for w in range(max(1, num_workers))
        ]
        out.append([cut_segments(span, a, b) for a, b in parts])
    return out
