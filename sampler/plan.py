"""A worker's reading plan for one epoch: pieces, their in-shard order, and the mixing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .epoch import TAG_ROWS, EpochLine, epoch_line, rank_length, span_pieces, worker_span
from .keyed import derive_key, derive_keys, permute
from .mixing import CHUNK, block_order

__all__ = ["Chunk", "Plan", "all_plans", "build_plan", "span_plan"]

I64Array = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

TAG_MIX = 3


@dataclass(frozen=True)
class Chunk:
    """Consecutive records of a plan: record k is row `rows[k]` of shard `shards[k]`,
    taken from the plan's piece `pieces[k]`."""

    pieces: I64Array
    shards: I64Array
    rows: I64Array
    block: tuple[int, int]  # the pieces [p0, p1) interleaved in this chunk's block

    def __len__(self) -> int:
        return int(self.rows.size)

    def head(self, n: int) -> Chunk:
        """The first n records."""
        return Chunk(self.pieces[:n], self.shards[:n], self.rows[:n], self.block)


@dataclass(frozen=True, eq=False)
class Plan:
    """What one worker of one rank reads in one epoch, and in which order.

    Piece p is rows ``[starts[p], stops[p])`` of shard ``shards[p]``: a contiguous row range
    in storage order, so a reader fetches only the row groups or tar members that hold it.
    Pieces are listed in epoch-line order and grouped in blocks of `window` consecutive
    pieces. With `keys` (shuffling on), each piece is read in a keyed permutation of its rows,
    and the pieces of a block are interleaved (see `sampler.mixing`); without `keys`, rows
    come in storage order, one piece after the other.
    """

    shards: I64Array  # (P,) shard id of each piece
    starts: I64Array  # (P,) first row of the piece
    stops: I64Array  # (P,) one past its last row
    keys: U64Array | None  # (P,) keys of the in-shard order; None: storage order
    window: int = 1

    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def sizes(self) -> I64Array:
        """(P,) records of each piece."""
        return self.stops - self.starts

    def blocks(self) -> list[tuple[int, int]]:
        """Piece ranges [p0, p1) interleaved together."""
        window = self.window if self.keys is not None else 1
        n = self.shards.size
        return [(p0, min(p0 + window, n)) for p0 in range(0, n, window)]

    def _before(self) -> I64Array:
        """(B+1,) records before each block, then the total."""
        sizes = self.sizes
        return np.cumsum([0] + [int(sizes[p0:p1].sum()) for p0, p1 in self.blocks()])

    def block_at(self, record: int) -> int:
        """Index (in `blocks()`) of the block holding the plan's record `record`; for the
        end of the plan, the number of blocks."""
        return int(np.searchsorted(self._before(), record, side="right")) - 1

    def chunks(self, start: int = 0, stop: int | None = None) -> Iterator[Chunk]:
        """The plan's records in reading order, records [start, stop), in chunks.

        Seeking costs O(pieces): nothing before `start` is generated.
        """
        stop = len(self) if stop is None else stop
        if not 0 <= start <= stop <= len(self):
            raise ValueError(f"need 0 <= start <= stop <= {len(self)}, got {start}, {stop}")
        blocks = self.blocks()
        before = self._before()
        b = int(np.searchsorted(before, start, side="right")) - 1
        skip = start - int(before[b]) if blocks else 0
        left = stop - start
        for p0, p1 in blocks[b:]:
            for chunk in self._block_chunks(p0, p1, skip):
                if left <= 0:
                    return
                if len(chunk) > left:
                    chunk = chunk.head(left)
                left -= len(chunk)
                yield chunk
            skip = 0

    def _block_chunks(self, p0: int, p1: int, skip: int) -> Iterator[Chunk]:
        sizes = [int(m) for m in self.sizes[p0:p1]]
        if self.keys is None or p1 - p0 == 1:
            # one piece after the other, each in its own order
            for i, m in enumerate(sizes):
                for lo in range(skip, m, CHUNK):
                    j = np.arange(lo, min(m, lo + CHUNK), dtype=np.int64)
                    yield self._chunk(np.full(j.size, p0 + i, dtype=np.int64), j, (p0, p1))
                skip = max(0, skip - m)
            return
        mix_keys = [derive_key(int(k), TAG_MIX) for k in self.keys[p0:p1]]
        for piece, j in block_order(sizes, mix_keys, skip):
            yield self._chunk(piece + p0, j, (p0, p1))

    def _chunk(self, pieces: I64Array, j: I64Array, block: tuple[int, int]) -> Chunk:
        """Turn (piece, rank inside the piece's order) into storage rows."""
        offsets = j
        if self.keys is not None:
            offsets = np.empty_like(j)
            for p in np.unique(pieces):
                mask = pieces == p
                offsets[mask] = permute(j[mask], int(self.sizes[p]), int(self.keys[p]))
        rows = self.starts[pieces] + offsets
        return Chunk(pieces=pieces, shards=self.shards[pieces], rows=rows, block=block)


def build_plan(
    sizes: I64Array,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    num_replicas: int,
    rank: int,
    worker: int = 0,
    num_workers: int = 1,
    window: int = 1,
    align: int = 1,
) -> Plan:
    """The plan of one worker: a pure function of its arguments, O(shards) to compute."""
    line = epoch_line(sizes, seed, epoch, shuffle)
    length = rank_length(line.num_records, num_replicas, drop_last)
    lo, hi = worker_span(rank, length, worker, num_workers, align)
    return _plan_on(line, lo, hi, seed=seed, epoch=epoch, shuffle=shuffle, window=window)


def all_plans(
    sizes: I64Array,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    num_replicas: int,
    num_workers: int = 1,
    window: int = 1,
) -> Iterator[tuple[int, int, Plan]]:
    """(rank, worker, plan) of every rank and worker, the epoch line computed once: O(shards
    + ranks * workers * log shards) for all of them together."""
    line = epoch_line(sizes, seed, epoch, shuffle)
    length = rank_length(line.num_records, num_replicas, drop_last)
    for rank in range(num_replicas):
        for worker in range(num_workers):
            lo, hi = worker_span(rank, length, worker, num_workers)
            yield rank, worker, _plan_on(line, lo, hi, seed, epoch, shuffle, window)


def span_plan(
    line: EpochLine, lo: int, hi: int, *, seed: int, epoch: int, shuffle: bool, window: int
) -> Plan:
    """The plan reading line positions [lo, hi) of an epoch line computed once for many
    spans: O(log shards + pieces) per span, the same plan `build_plan` gives for that span."""
    return _plan_on(line, lo, hi, seed, epoch, shuffle, window)


def _plan_on(
    line: EpochLine, lo: int, hi: int, seed: int, epoch: int, shuffle: bool, window: int
) -> Plan:
    shards, starts, stops = span_pieces(line, lo, hi)
    keys = derive_keys(derive_key(seed, epoch, TAG_ROWS), shards, starts) if shuffle else None
    return Plan(shards=shards, starts=starts, stops=stops, keys=keys, window=window)
