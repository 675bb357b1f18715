"""A mixture epoch's arithmetic: per-stream counts and the stratified schedule.

*Counts.* A rank's epoch of L positions gives stream k exactly c_k of them: the largest
remainder (Hamilton) apportionment of L by the weights, computed exactly with fractions,
ties broken by the streams' name order, so the counts do not depend on the order in which
the streams are listed.

*Schedule.* Stream k's j-th record (j = 0 .. c_k - 1) has the ideal time
t_kj = (2j + 1) / (2 c_k) in (0, 1): each stream spread evenly over the epoch. The epoch's
positions are all these records sorted by (t, name order), a merge of evenly spaced
sequences, so the schedule depends only on the counts (and the name order for ties).

Bound. Let position i hold the record of time t. Before it, stream k holds
n_k = c_k t + e_k records with -1/2 <= e_k <= 1/2 (exact time ties included), and
i = sum n_k, so n_k - i c_k / L = e_k (1 - a_k) - a_k sum_{m != k} e_m with a_k = c_k / L:

    |n_k - i c_k / L| <= (1 + (K - 2) a_k) / 2      (K streams with records)

which is < 1 for K <= 3 and < 2 for K <= 5. A window of B positions holds stream k within
1 + (K - 2) a_k of B c_k / L: within 2 for K <= 3. With more streams no merge of fixed
times keeps every window within 2 (three streams of one record each meet at t = 1/2).

Seeking. The counts before any position are found in O(K log L) exact integer steps (a
binary search over the cells [m / L, (m + 1) / L), each holding at most one record of each
stream); the stream ids of positions [i0, i1) cost O(K + i1 - i0), never an O(L) array.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_POSITIONS", "apportion", "counts_before", "name_ranks", "stream_ids"]

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]

CHUNK = 1 << 16  # positions per generated chunk of stream ids
MAX_POSITIONS = 1 << 52  # L below this keeps 2j + 1 and 2 c_k exact in float64


def name_ranks(names: Sequence[str]) -> list[int]:
    """Each name's rank in sorted order: the tie-break of apportionment and schedule."""
    order = sorted(range(len(names)), key=lambda k: names[k])
    ranks = [0] * len(names)
    for r, k in enumerate(order):
        ranks[k] = r
    return ranks


def apportion(
    total: int, weights: Sequence[int | float | Fraction], ranks: Sequence[int]
) -> list[int]:
    """Largest remainder apportionment of `total` by `weights` (>= 0, exact), sum `total`.

    Each stream gets the floor of its quota total * w_k / sum(w); the seats left over go
    one each to the largest remainders, equal remainders to the lower rank (name order).
    A stream of weight 0 gets nothing.
    """
    exact = [Fraction(w) for w in weights]
    whole = sum(exact, Fraction(0))
    if whole <= 0:
        if total:
            raise ValueError(f"cannot apportion {total} records by weights {list(weights)}")
        return [0] * len(exact)
    quotas = [total * w / whole for w in exact]
    seats = [int(q) for q in quotas]  # floor: quotas are >= 0
    left = total - sum(seats)
    order = sorted(range(len(exact)), key=lambda k: (seats[k] - quotas[k], ranks[k]))
    for k in order[:left]:
        seats[k] += 1
    return seats


def _before_cell(c: int, m: int, length: int) -> int:
    """Records of a stream of c records with time (2j + 1) / (2c) < m / length."""
    # j counts iff (2j + 1) * length <= 2 c m - 1; (o + 1) // 2 odd numbers lie in [1, o]
    return max(0, ((2 * c * m - 1) // length + 1) // 2) if c else 0


def counts_before(counts: Sequence[int], ranks: Sequence[int], position: int) -> list[int]:
    """Per stream, how many of the schedule's first `position` positions it holds.

    O(K log L) exact integer steps. Cells [m / L, (m + 1) / L) hold at most one record per
    stream (their spacing 1 / c_k is at least 1 / L), so after the binary search for the
    cell of `position`, sorting that cell's few records by (time, rank) finishes the count.
    """
    cs = [int(c) for c in counts]
    length = sum(cs)
    if not 0 <= position <= length:
        raise ValueError(f"position must lie in [0, {length}], got {position}")
    if position == length:
        return cs

    def before(m: int) -> list[int]:
        return [_before_cell(c, m, length) for c in cs]

    lo, hi = 0, length  # sum(before(lo)) <= position < sum(before(hi)) = length
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sum(before(mid)) <= position:
            lo = mid
        else:
            hi = mid
    held, nxt = before(lo), before(lo + 1)
    cell = [k for k in range(len(cs)) if nxt[k] > held[k]]
    cell.sort(key=lambda k: (Fraction(2 * held[k] + 1, 2 * cs[k]), ranks[k]))
    for k in cell[: position - sum(held)]:
        held[k] += 1
    return held


def _merge(
    counts: Sequence[int], ranks: Sequence[int], a: Sequence[int], b: Sequence[int]
) -> I64Array:
    """(n,) stream ids of records j in [a_k, b_k) of each stream k, in schedule order."""
    # the streams laid end to end in rank order: each one's times increase with j, so one
    # stable sort by time merges these sorted runs (timsort) and breaks time ties by rank,
    # as np.lexsort((rank, t)) does at 6 times the cost (0.64 -> 0.10 ms, 65,536 positions)
    streams = sorted(range(len(counts)), key=lambda k: ranks[k])
    parts = [np.arange(a[k], b[k], dtype=np.int64) for k in streams]
    # (n,) stream, record j, and ideal time of every record; one correctly rounded division
    # each, so a float order never contradicts the exact one: it can only tie distinct times
    stream = np.concatenate([np.full(p.size, k, dtype=np.int64) for k, p in zip(streams, parts)])
    j = np.concatenate(parts)
    den = 2 * np.asarray(counts, dtype=np.int64)[stream]
    t = (2 * j + 1) / den
    order = np.argsort(t, kind="stable")
    stream, j, den, t = stream[order], j[order], den[order], t[order]
    # neighbours with equal floats but different exact times (different fractions in lowest
    # terms): only then does the exact order need more than the float one. Only equal
    # floats are compared, by cross products where they fit (np.gcd over every position
    # was 2/3 of this function's time)
    same = np.flatnonzero(t[1:] == t[:-1])
    num, den_same = 2 * j[same] + 1, den[same]
    nxt, den_nxt = 2 * j[same + 1] + 1, den[same + 1]
    if den.size and int(den.max()) < 1 << 31:  # both below 2^31: the products fit int64
        clash = same[num * den_nxt != nxt * den_same]
    else:
        g, h = np.gcd(num, den_same), np.gcd(nxt, den_nxt)
        clash = same[(num // g != nxt // h) | (den_same // g != den_nxt // h)]
    done = 0
    for i in clash.tolist():
        if i >= done:
            done = _exact_run(stream, j, t, i, counts, ranks)
    return stream


def _exact_run(
    stream: I64Array, j: I64Array, t: F64Array, i: int, counts: Sequence[int], ranks: Sequence[int]
) -> int:
    """Sort the run of equal floats around i by exact (time, rank), in place; its end."""
    lo, hi = i, i + 2
    while lo > 0 and t[lo - 1] == t[i]:
        lo -= 1
    while hi < t.size and t[hi] == t[i]:
        hi += 1
    items = [(int(k), int(jj)) for k, jj in zip(stream[lo:hi], j[lo:hi])]
    items.sort(key=lambda x: (Fraction(2 * x[1] + 1, 2 * int(counts[x[0]])), ranks[x[0]]))
    stream[lo:hi] = [k for k, _ in items]
    j[lo:hi] = [jj for _, jj in items]
    return hi


def stream_ids(
    counts: Sequence[int], ranks: Sequence[int], start: int, stop: int, chunk: int = CHUNK
) -> Iterator[I64Array]:
    """The stream id of each position in [start, stop), in chunks of at most `chunk`.

    Costs O(K log L) per chunk plus O(positions): nothing before `start` is generated.
    """
    length = sum(int(c) for c in counts)
    if not 0 <= start <= stop <= length:
        raise ValueError(f"need 0 <= start <= stop <= {length}, got {start}, {stop}")
    if length >= MAX_POSITIONS:
        raise ValueError(f"a schedule of {length} positions exceeds {MAX_POSITIONS}")
    a = counts_before(counts, ranks, start)
    for lo in range(start, stop, chunk):
        b = counts_before(counts, ranks, min(stop, lo + chunk))
        yield _merge(counts, ranks, a, b)
        a = b
