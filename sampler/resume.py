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

import itertools
from collections.abc import Sequence

from .epoch import worker_span

__all__ = [
    "Segment",
    "Streams",
    "base_streams",
    "continue_streams",
    "cut_segments",
    "phase_parts",
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


def phase_parts(
    lengths: Sequence[int], num_workers: int, align: int, cumulative: bool = True
) -> list[list[tuple[int, int]]]:
    """[phase][worker] -> positions [lo, hi) of that phase (from its start) the worker
    reads, for phases of `lengths` positions laid end to end; in each phase the workers'
    parts follow one another in worker order.

    The epoch's units of `align` positions are dealt to the workers in turn (0, 1, ...,
    W-1, 0, ...), the last round to the workers `worker_span` gives one unit more, so each
    worker reads in the end exactly its `worker_span` share of the epoch, and its count
    through any phase is what the deal gives it up to that phase's end. A DataLoader taking
    items of `align` records from its workers in turn so delivers every record of a phase
    before any of the next.

    `cumulative=False`: each phase cut on its own by `worker_span` (the layout of mixture
    states saved without "phase_cut"; there the same worker can take the short share of
    every phase and run ahead phase after phase)."""
    workers = max(1, num_workers)
    if not cumulative:
        return [
            [(lo, hi) for lo, hi in (worker_span(0, n, w, workers, align) for w in range(workers))]
            for n in lengths
        ]
    total = sum(lengths)
    units = -(-total // align)
    full = units // workers  # whole rounds of the deal
    # the last, partial round's workers: those worker_span gives full + 1 units
    spans = [worker_span(0, total, w, workers, align) for w in range(workers)]
    extra = [w for w, (lo, hi) in enumerate(spans) if hi - lo > align * full]

    def dealt(u: int, w: int) -> int:  # units among the first u dealt to worker w
        if u <= full * workers:
            return u // workers + (w < u % workers)
        return full + (w in extra[: u - full * workers])

    def owner(u: int) -> int:  # the worker unit u is dealt to
        return u % workers if u < full * workers else extra[u - full * workers]

    out, before, end = [], [0] * workers, 0
    for n in lengths:
        end += n
        u, r = divmod(end, align)
        upto = [align * dealt(u, w) + (r if r and w == owner(u) else 0) for w in range(workers)]
        counts = [c - b for c, b in zip(upto, before)]
        starts = itertools.accumulate(counts[:-1], initial=0)
        out.append([(a, a + c) for a, c in zip(starts, counts)])
        before = upto
    return out


def phased_streams(
    ends: Sequence[int], num_replicas: int, num_workers: int, align: int, cumulative: bool = True
) -> Streams:
    """A mixture's epoch of phases ending at positions `ends`, not resumed: each worker
    reads its part of each phase (`phase_parts`), in positions of its rank's epoch. A
    DataLoader taking items from its workers in turn so delivers the phases in order."""
    workers = max(1, num_workers)
    lengths = [b - a for a, b in zip((0, *ends), ends)]
    cuts = phase_parts(lengths, workers, align, cumulative)
    parts = [
        [(a + lo, a + hi) for a, cut in zip((0, *ends), cuts) for lo, hi in [cut[w]] if lo < hi]
        for w in range(workers)
    ]
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
    cumulative: bool = True,
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
    new worker reads its part of each phase in turn (`phase_parts`, `cumulative` as there).
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
    # each new rank's part of each phase, and each worker's of that (phase_parts)
    lengths = [_rank_length(_length(p), num_replicas, drop_last) for p in phases]
    parts = phase_parts(lengths, num_workers, align, cumulative)
    cuts = [_cut(p, num_replicas, num_workers, align, drop_last, w) for p, w in zip(phases, parts)]
    return [
        [[seg for cut in cuts for seg in cut[r][w]] for w in range(max(1, num_workers))]
        for r in range(num_replicas)
    ]


def _rank_length(total: int, num_replicas: int, drop_last: bool) -> int:
    return total // num_replicas if drop_last else -(-total // num_replicas)


def _cut(
    rest: list[Segment],
    num_replicas: int,
    num_workers: int,
    align: int,
    drop_last: bool,
    parts: list[tuple[int, int]] | None = None,
) -> Streams:
    """`rest` laid end to end, cut in equal spans over the ranks and each over workers
    (`parts`: each worker's [lo, hi) of a rank's span; default its `worker_span`)."""
    total = _length(rest)
    length = _rank_length(total, num_replicas, drop_last)
    workers = max(1, num_workers)
    parts = parts or [worker_span(0, length, w, workers, align) for w in range(workers)]
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
        out.append([cut_segments(span, a, b) for a, b in parts])
    return out
