"""Interleaving a block of pieces so that neighbouring records come from different shards.

Reading order inside a block of k pieces (m_i records each) is a *stratified random
merge*: the j-th record of piece i (in that piece's own order) gets the position
``t = (j + u_ij) / m_i`` with u_ij a keyed float in [0, 1), and the block is read by
increasing t (ties by piece). Each piece is thus spread evenly over the whole block (one
record per 1/m_i of it) while which piece comes next is random, and each piece keeps its
own order. The merge is generated in *slices* of t, about CHUNK records each, so a block
of any size costs O(CHUNK + k) memory and a seek into it needs no pass over what it skips.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .keyed import unit_floats

__all__ = ["CHUNK", "block_order", "distinct_per_batch", "record_positions"]

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]

CHUNK = 1 << 16  # records per generated slice; changes the chunking, never the order
_MARGIN = 2  # candidate positions around a slice edge; covers float rounding of t


def _position(j: I64Array, m: int, key: int) -> F64Array:
    """(n,) t of records j of a piece of m records."""
    return (j + unit_floats(j, key)) / m


def record_positions(j: I64Array, m: int, key: int) -> F64Array:
    """(n,) where records j of a piece of m records (mixing key `key`) lie in its block's
    reading, as a share t in [0, 1) of the block: the block is read by increasing t."""
    return _position(j, m, key)


def _slice_at(t: F64Array, ns: int) -> I64Array:
    """(n,) which of the ns slices positions t fall in; non-decreasing in t."""
    return np.minimum(np.floor(t * ns), ns - 1).astype(np.int64)


def _count_before(sizes: Sequence[int], keys: Sequence[int], s: int, ns: int) -> int:
    """How many records of the block lie in slices before s."""
    total = 0
    for m, key in zip(sizes, keys):
        lo = max(0, s * m // ns - _MARGIN)
        j = np.arange(lo, min(m, s * m // ns + _MARGIN + 2), dtype=np.int64)
        total += lo + int(np.count_nonzero(_slice_at(_position(j, m, key), ns) < s))
    return total


def _slice(sizes: Sequence[int], keys: Sequence[int], s: int, ns: int) -> tuple[I64Array, I64Array]:
    """(piece, j) of every record in slice s, in reading order."""
    pieces, js, ts = [], [], []
    for i, (m, key) in enumerate(zip(sizes, keys)):
        lo = max(0, s * m // ns - _MARGIN)
        hi = min(m, -(-(s + 1) * m // ns) + _MARGIN)
        j = np.arange(lo, hi, dtype=np.int64)
        t = _position(j, m, key)  # once: which slice, then the order inside it
        keep = _slice_at(t, ns) == s
        js.append(j[keep])
        ts.append(t[keep])
        pieces.append(np.full(js[-1].size, i, dtype=np.int64))
    piece, j, t = np.concatenate(pieces), np.concatenate(js), np.concatenate(ts)
    # by t, ties by piece: the pieces lie in increasing order, so one stable sort by t does
    # (what np.lexsort((piece, t)) gives, at half its cost); j stays increasing
    order = np.argsort(t, kind="stable")
    return piece[order], j[order]


def block_order(
    sizes: Sequence[int], keys: Sequence[int], skip: int = 0, chunk: int = CHUNK
) -> Iterator[tuple[I64Array, I64Array]]:
    """Chunks of about `chunk` (piece, j): the block's reading order from record `skip` on.

    `sizes` are the pieces' record counts, `keys` their mixing keys. `piece` indexes
    `sizes`; `j` is the rank of the record inside its piece's own order. The order does not
    depend on `chunk`.
    """
    n = int(sum(sizes))
    ns = max(1, -(-n // chunk))
    # first slice that holds record `skip`: count_before is non-decreasing in s. With no
    # skip, slice 0 (an empty slice yields nothing): the search cost 7% of a 65,536-record
    # block's order
    lo, hi = 0, ns if skip else 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _count_before(sizes, keys, mid, ns) <= skip:
            lo = mid
        else:
            hi = mid
    drop = skip - _count_before(sizes, keys, lo, ns) if skip else 0
    for s in range(lo, ns):
        piece, j = _slice(sizes, keys, s, ns)
        if drop:
            piece, j, drop = piece[drop:], j[drop:], 0
        if piece.size:
            yield piece, j


def distinct_per_batch(shard_ids: npt.ArrayLike, batch_size: int = 64) -> float:
    """The mixing metric: mean number of distinct shards among each full batch of
    `batch_size` consecutive records (1.0 = every batch from a single shard)."""
    ids = np.asarray(shard_ids)
    full = ids.size // batch_size
    if full == 0:
        return float("nan")
    batches = np.sort(ids[: full * batch_size].reshape(full, batch_size), axis=1)
    # (full,) 1 + number of places where the sorted batch changes value
    distinct = 1 + np.count_nonzero(np.diff(batches, axis=1), axis=1)
    return float(distinct.mean())
