"""A worker's reading plan for one epoch: pieces, their in-shard order, and the mixing.

In-shard order, group by group: a shard may be cut into *groups*, runs of rows a reader
decodes together (Parquet row groups, runs of tar members; given as `groups` per shard).
A piece (a shard's contiguous row range) holding several groups is read group after group,
the groups in a keyed random order and each group's rows in a keyed permutation of their
own; so a reader holds one group per piece at a time, not the whole piece, and the records
of a shard still land anywhere in its span (the rank correlation between a record's row
and its place in the stream is about 0). A piece of one group (or a plan without groups)
is read in one keyed permutation of all its rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .keyed import derive_key, permute, unit_floats
from .mixing import CHUNK, block_order, record_positions

__all__ = ["DEFAULT_WINDOW", "Chunk", "Groups", "Plan", "stable_order"]

I64Array = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

TAG_MIX = 3
DEFAULT_WINDOW = 8  # pieces interleaved per block; see the README for the mixing it gives
TAG_GROUPS = 4  # the order of a piece's groups
TAG_GROUP = 5  # the order inside one group
LOCATE = 8192  # records of the slice that finds one record's place in its block

Groups = Sequence[Sequence[int]]  # per shard: records of each of its groups, in storage order


@dataclass(frozen=True)
class Chunk:
    """Consecutive records of a plan: record k is row `rows[k]` of shard `shards[k]`,
    taken from the plan's piece `pieces[k]`."""

    pieces: I64Array
    shards: I64Array
    rows: I64Array
    block: tuple[int, int]  # the pieces [p0, p1) interleaved in this chunk's block
    groups: I64Array | None = None  # (n,) which of its piece's groups holds record k

    def __len__(self) -> int:
        return int(self.rows.size)

    def head(self, n: int) -> Chunk:
        """The first n records."""
        groups = None if self.groups is None else self.groups[:n]
        return Chunk(self.pieces[:n], self.shards[:n], self.rows[:n], self.block, groups)


@dataclass(frozen=True, eq=False)
class Plan:
    """What one worker of one rank reads in one epoch, and in which order.

    Piece p is rows ``[starts[p], stops[p])`` of shard ``shards[p]``: a contiguous row range
    in storage order, so a reader fetches only the row groups or tar members that hold it.
    Pieces are listed in epoch-line order and grouped in blocks of `window` consecutive
    pieces. With `keys` (shuffling on), each piece is read in its keyed order (group by
    group when `cuts` gives it several groups, see the module's docstring), and the pieces
    of a block are interleaved (see `sampler.mixing`); without `keys`, rows come in storage
    order, one piece after the other.
    """

    shards: I64Array  # (P,) shard id of each piece
    starts: I64Array  # (P,) first row of the piece
    stops: I64Array  # (P,) one past its last row
    keys: U64Array | None  # (P,) keys of the in-shard order; None: storage order
    window: int = 1
    # per piece, (G+1,) the first row of each of its G groups, then its stop; None: one
    # group a piece
    cuts: tuple[I64Array, ...] | None = None

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

    def block_starts(self) -> I64Array:
        """(B+1,) records of the plan before each block, then its length."""
        return self._before()

    def block_at(self, record: int) -> int:
        """Index (in `blocks()`) of the block holding the plan's record `record`; for the
        end of the plan, the number of blocks."""
        return int(np.searchsorted(self._before(), record, side="right")) - 1

    def chunks(self, start: int = 0, stop: int | None = None, size: int = CHUNK) -> Iterator[Chunk]:
        """The plan's records in reading order, records [start, stop), in chunks of about
        `size` records (the chunking never changes the order).

        Seeking costs O(pieces): nothing before `start` is generated, and little after
        `stop`: a block is cut in chunks of at most the records left (a mixture's second
        pass that takes 9,830 records of a 65,536-record block made the whole block's order).
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
            if left <= 0:
                return
            for chunk in self._block_chunks(p0, p1, skip, min(size, left)):
                if len(chunk) > left:
                    chunk = chunk.head(left)
                left -= len(chunk)
                yield chunk
                if left <= 0:  # (before the next chunk is made)
                    return
            skip = 0

    def _block_chunks(self, p0: int, p1: int, skip: int, size: int) -> Iterator[Chunk]:
        sizes = [int(m) for m in self.sizes[p0:p1]]
        memo = _Memo()
        if self.keys is None or p1 - p0 == 1:
            # one piece after the other, each in its own order
            for i, m in enumerate(sizes):
                for lo in range(skip, m, size):
                    j = np.arange(lo, min(m, lo + size), dtype=np.int64)
                    pieces = np.full(j.size, p0 + i, dtype=np.int64)
                    yield self._chunk(pieces, j, (p0, p1), memo)
                skip = max(0, skip - m)
            return
        mix_keys = [derive_key(int(k), TAG_MIX) for k in self.keys[p0:p1]]
        for piece, j in block_order(sizes, mix_keys, skip, size):
            yield self._chunk(piece + p0, j, (p0, p1), memo)

    def _chunk(
        self, pieces: I64Array, j: I64Array, block: tuple[int, int], memo: _Memo | None = None
    ) -> Chunk:
        """Turn (piece, rank inside the piece's order) into storage rows."""
        rows = self.starts[pieces] + j
        groups = np.zeros(j.size, dtype=np.int64)
        if self.keys is not None or self.cuts is not None:
            # each piece's records, in reading order: one stable sort by piece, not a mask
            # a piece (a block's chunk is 8 pieces x 32,768 records)
            for at in _runs_of(pieces):
                rows[at], groups[at] = self.piece_rows(int(pieces[at[0]]), j[at], memo)
        return Chunk(pieces, self.shards[pieces], rows, block, groups)

    def _group_order(self, p: int) -> tuple[I64Array, I64Array, I64Array]:
        """(cuts, order, ends) of piece p: (G+1,) its group bounds; (G,) the group read at
        each place of its order; (G,) records of its order through each place."""
        cuts = self.cuts[p] if self.cuts is not None else None
        if cuts is None:
            cuts = np.array([self.starts[p], self.stops[p]], dtype=np.int64)
        counts = np.diff(cuts)
        n = counts.size
        if self.keys is None or n == 1:
            order = np.arange(n, dtype=np.int64)
        else:
            order = permute(np.arange(n), n, derive_key(int(self.keys[p]), TAG_GROUPS))
        return cuts, order, np.cumsum(counts[order])

    def piece_rows(
        self, p: int, j: I64Array, memo: _Memo | None = None
    ) -> tuple[I64Array, I64Array]:
        """(rows, groups), each (n,): the storage rows of records `j` of piece p's own order,
        and which of the piece's groups (by storage order) holds each.

        A piece of one group: one keyed Feistel permutation of its rows (no table, any
        size). Of several: each group's rows in the order of a keyed hash of their ranks
        (an argsort, O(group) memory once per group; `memo` keeps the piece's current one
        between calls)."""
        memo = memo if memo is not None else _Memo()
        cuts, order, ends = memo.groups(self, p)
        # (n,) place in the group order of each record, then its rank inside that group
        place = np.searchsorted(ends, j, side="right")
        rank = j - (ends[place] - np.diff(cuts)[order[place]])
        groups = order[place]
        if self.keys is None:
            return cuts[groups] + rank, groups
        if order.size == 1:  # one group: one keyed permutation of the whole piece
            return self.starts[p] + permute(j, int(self.sizes[p]), int(self.keys[p])), groups
        rows = np.empty_like(j)
        for at in _runs_of(place):
            g = int(order[place[at[0]]])
            rows[at] = cuts[g] + memo.inside(self, p, g)[rank[at]]
        return rows, groups

    def group_rows(self, p: int, g: int) -> tuple[int, int]:
        """Rows [start, stop) of piece p's group g (storage order)."""
        if self.cuts is None:
            return int(self.starts[p]), int(self.stops[p])
        cuts = self.cuts[p]
        return int(cuts[g]), int(cuts[g + 1])

    def group_schedule(
        self, block: int, skip: int = 0, stop: int | None = None
    ) -> list[tuple[int, int]]:
        """(piece, group) of every group that records [skip, stop) of block `block` (an
        index into `blocks()`; records counted from the block's start) read, in the order
        the reading first needs them.

        A piece's groups are needed one after the other, the k-th when the block's reading
        reaches the share of the piece's records its k-1 first groups hold (the stratified
        merge spreads each piece evenly). Groups wholly before `skip` or wholly after `stop`
        are left out (a group at either edge may be listed without being read from).
        """
        p0, p1 = self.blocks()[block]
        sizes = [int(m) for m in self.sizes[p0:p1]]
        total = sum(sizes)
        stop = total if stop is None else stop
        # per piece, records surely before `skip`, and records that may come before `stop`
        before = self._records_before(p0, p1, skip, surely=True)
        upto = self._records_before(p0, p1, stop, surely=False)
        interleaved = self.keys is not None and p1 - p0 > 1
        wanted: list[tuple[float, int, int]] = []
        for i, m in enumerate(sizes):
            _, order, ends = self._group_order(p0 + i)
            starts = np.concatenate(([0], ends[:-1]))
            for k in np.flatnonzero((ends > before[i]) & (starts < upto[i])):
                # interleaved: the share of the block read when the group is first needed
                t = float(starts[k]) / m if interleaved else float(k)
                wanted.append((t, i, int(order[k])))
        wanted.sort()
        return [(p0 + i, g) for _, i, g in wanted]

    def _records_before(self, p0: int, p1: int, at: int, surely: bool) -> list[int]:
        """Per piece of block [p0, p1), how many of its records come before the block's
        record `at`: surely (a lower bound) or possibly (an upper bound). Exact for the
        piece of record `at` and for pieces read one after the other."""
        sizes = [int(m) for m in self.sizes[p0:p1]]
        if at <= 0 or at >= sum(sizes):
            return [0] * len(sizes) if at <= 0 else sizes
        if self.keys is None or p1 - p0 == 1:  # pieces one after the other
            out, left = [], at
            for m in sizes:
                out.append(min(m, left))
                left -= out[-1]
            return out
        mix_keys = [derive_key(int(k), TAG_MIX) for k in self.keys[p0:p1]]
        # the first record at `at`: a small slice holds it (the order does not depend on the
        # slicing; a slice of CHUNK made the order of a whole block of up to 65,536 records)
        piece, j = next(block_order(sizes, mix_keys, at, LOCATE))
        i, first = int(piece[0]), int(j[0])
        t = float(record_positions(np.array([first]), sizes[i], mix_keys[i])[0])
        # record j of a piece of m lies at t in [j/m, (j+1)/m): those with j < floor(t m)
        # surely come before t, those with j <= floor(t m) possibly
        out = [min(m, int(np.floor(t * m)) + (0 if surely else 1)) for m in sizes]
        out[i] = first
        return out


class _Memo:
    """What a pass over a block computes once per piece: its group order, and the row order
    inside the group it reads now (a piece's groups are read one after the other)."""

    def __init__(self) -> None:
        self._orders: dict[int, tuple[I64Array, I64Array, I64Array]] = {}
        self._inside: dict[int, tuple[int, I64Array]] = {}

    def groups(self, plan: Plan, p: int) -> tuple[I64Array, I64Array, I64Array]:
        if p not in self._orders:
            self._orders[p] = plan._group_order(p)
        return self._orders[p]

    def inside(self, plan: Plan, p: int, g: int) -> I64Array:
        """(m,) the rows of piece p's group g (0-based in the group) in their keyed order."""
        held = self._inside.get(p)
        if held is None or held[0] != g:
            assert plan.keys is not None
            cuts = self.groups(plan, p)[0]
            m = int(cuts[g + 1] - cuts[g])
            key = derive_key(int(plan.keys[p]), TAG_GROUP, g)
            # (m,) a keyed hash per rank, then the ranks sorted by it: a random permutation
            held = (g, hash_order(unit_floats(np.arange(m), key)))
            self._inside[p] = held
        return held[1]


def _runs_of(values: I64Array) -> list[I64Array]:
    """The positions of each distinct value of a non-empty int array, each ascending, by
    increasing value: slices of one stable argsort (or of the array itself when it is
    already sorted, as a piece's group places are)."""
    if values.size and bool((values[1:] >= values[:-1]).all()):
        order = np.arange(values.size)
        ordered = values
    else:
        order = stable_order(values)
        ordered = values[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    return np.split(order, cuts) if cuts.size else [order]


def hash_order(values: npt.NDArray[np.float64]) -> I64Array:
    """``np.argsort(values, kind="stable")`` of keyed hashes, 3-4 times faster: numpy's
    quicksort, whose order is the same wherever no two values are equal (hashes of 53 bits:
    a tie is rare, and then the stable sort is done instead). Measured, 1,024 fresh hashes:
    38-42 us stable, 11-13 this way; the stable sort stays where the values lie in sorted
    runs (`mixing._slice`: timsort merges them, 3 times faster than quicksort)."""
    order = np.argsort(values)
    ordered = values[order]
    if bool((ordered[1:] == ordered[:-1]).any()):
        return np.argsort(values, kind="stable")
    return order


def stable_order(values: I64Array) -> I64Array:
    """``np.argsort(values, kind="stable")`` of an int array, sorted as 8 or 16-bit ints
    where the values' range allows: numpy's stable sort of those is a radix sort (measured:
    0.1 ms against 1.4 for 65,536 int64 values of 8 pieces)."""
    if values.size == 0:
        return np.arange(0, dtype=np.int64)
    lo = int(values.min())
    span = int(values.max()) - lo
    if span < 1 << 16:
        small = (values - lo).astype(np.uint8 if span < 1 << 8 else np.uint16)
        return np.argsort(small, kind="stable").astype(np.int64, copy=False)
    return np.argsort(values, kind="stable")
