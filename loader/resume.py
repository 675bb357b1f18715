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

__all__ = ["resume_point"]


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
