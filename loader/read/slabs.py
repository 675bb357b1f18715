"""What a slab of a reading touches: the read groups of a chunk's records, and the pieces
of the block a reading opens with (loader.read.reading)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream.sampler.plan import Chunk, Plan

__all__ = ["Run", "distinct_groups", "first_block_pieces"]

Run = tuple[Plan, int, int]  # records [start, stop) of a plan, in its reading order


def distinct_groups(chunk: Chunk, lo: int, hi: int) -> tuple[list[tuple[int, int]], Any, Any, Any]:
    """The groups records [lo, hi) of the chunk read: (their (piece, group) keys; (n,) which
    of them each record reads; (k,) where each is first read; (k,) where last). One
    counting pass over small dense codes (np.unique would sort)."""
    n = hi - lo
    pieces = chunk.pieces[lo:hi] - chunk.block[0]
    groups = chunk.groups[lo:hi] if chunk.groups is not None else np.zeros(n, dtype=np.int64)
    width = int(groups.max()) + 1 if n else 1
    dense = pieces * width + groups  # (n,) a small code per (piece, group)
    present = np.flatnonzero(np.bincount(dense))  # (k,) the codes read, ascending
    index = np.empty(int(present[-1]) + 1 if present.size else 0, dtype=np.int64)
    index[present] = np.arange(present.size)
    which = index[dense]
    at = np.arange(n, dtype=np.int64)
    last = np.empty(present.size, dtype=np.int64)
    last[which] = at  # repeated indices: the last assignment stays
    first = np.empty(present.size, dtype=np.int64)
    first[which[::-1]] = at[::-1]
    keys = [(chunk.block[0] + d // width, d % width) for d in present.tolist()]
    return keys, which, first, last


def first_block_pieces(runs: list[Run]) -> int:
    """Pieces of the block the first run with records starts in (0: no records)."""
    for plan, a, b in runs:
        if a < b:
            p0, p1 = plan.blocks()[plan.block_at(a)]
            return p1 - p0
    return 0
