"""Packing's arithmetic: an epoch's documents as one line of tokens, cut into blocks.

The *token line* of an epoch is every document of the dataset in the order one rank of
one worker would read the whole epoch (the epoch line of sampler.epoch, read as a single
span: shards in the epoch's shard order, each in its keyed in-shard order, `window`
shards interleaved), document d taking ``tokens[d]`` places (its tokens plus separators;
a document of no tokens takes none). Block g is places ``[g * length, (g + 1) * length)``.
An epoch has ``B = T // length`` blocks (T places in all); a job of R ranks uses the
first ``R * (B // R)`` of them, rank r blocks ``[r * n, (r + 1) * n)`` with ``n = B // R``,
so every rank makes the same number, no place is in two blocks, and fewer than
``length + R * length`` places are dropped an epoch (``dropped``).

The line does not depend on the number of ranks or workers, so any set of blocks, a
worker's part or the rest of an epoch after an elastic resume, is read by locating its
first and last place: which document, and how far into it (`PackLine.run`). Locating
costs O(shards) once an epoch plus the documents of the one interleaved block of
`window` shards holding the place; nothing is O(documents of the dataset).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .epoch import EpochLine, epoch_line
from .plan import Groups, Plan
from .planning import span_plan

__all__ = ["PackLine", "PackRun", "blocks_per_rank", "dropped", "shard_tokens"]

I64Array = npt.NDArray[np.int64]


def shard_tokens(sizes: I64Array, tokens: I64Array) -> I64Array:
    """(S,) places of each shard: the sum of its documents' `tokens` ((N,) by global
    record id, shards laid end to end in storage order)."""
    ends = np.cumsum(sizes)
    summed = np.concatenate(([0], np.cumsum(tokens, dtype=np.int64)))
    out: I64Array = (summed[ends] - summed[ends - sizes]).astype(np.int64)
    return out


def blocks_per_rank(total_tokens: int, length: int, num_replicas: int) -> int:
    """Blocks every rank makes an epoch: ``(T // length) // R``."""
    return (total_tokens // length) // num_replicas


def dropped(total_tokens: int, length: int, num_replicas: int) -> int:
    """Places of an epoch in no rank's block: the tail of the last block, and the blocks
    left over when the epoch's blocks are shared out equally."""
    return (
        total_tokens - num_replicas * blocks_per_rank(total_tokens, length, num_replicas) * length
    )


@dataclass(frozen=True)
class PackRun:
    """What a reader packs for blocks [g0, g1) of the token line: documents
    [start, stop) of `plan`, less `skip` places of the first (read by the blocks before)
    and `rest` places of the last (read by the blocks after)."""

    plan: Plan
    start: int
    stop: int
    skip: int
    rest: int
    blocks: int
    first_block: int  # g0: the block's number on the epoch's line


class PackLine:
    """One epoch's token line (see the module docstring).

    `sizes` (S,) documents per shard; `tokens` (N,) places of each document by global
    record id; `per_shard` (S,) their sums (`shard_tokens`: pass it when making lines of
    many epochs, so each costs O(shards), not O(documents)); the rest as `ShardSampler`
    takes them (`window` 1 without shuffle)."""

    def __init__(
        self,
        sizes: I64Array,
        tokens: I64Array,
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int,
        groups: Groups | None = None,
        per_shard: I64Array | None = None,
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.offsets = np.cumsum(self.sizes) - self.sizes
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.window = window if shuffle else 1
        self.groups = groups
        self.line: EpochLine = epoch_line(self.sizes, seed, epoch, shuffle)
        if per_shard is None:
            per_shard = shard_tokens(self.sizes, self.tokens)
        per_shard = np.asarray(per_shard, dtype=np.int64)[self.line.shards]
        firsts = np.arange(0, per_shard.size, self.window)
        # (K+1,) places and documents before each interleaved block, then the totals
        self.block_places = np.concatenate(([0], np.cumsum(np.add.reduceat(per_shard, firsts))))
        ends = np.concatenate(([0], self.line.ends))
        self.block_docs = np.concatenate((ends[firsts], ends[-1:])).astype(np.int64)
        if per_shard.size == 0:
            self.block_places = self.block_docs = np.zeros(1, dtype=np.int64)
        self._memo: dict[int, I64Array] = {}  # the last blocks' document places

    @property
    def total(self) -> int:
        """T: places of the epoch's documents."""
        return int(self.block_places[-1])

    def _plan(self, k0: int, k1: int) -> Plan:
        """The plan of interleaved blocks [k0, k1): the same order the whole line's plan
        gives them (each block's pieces, keys and mixing depend on its shards alone)."""
        return span_plan(
            self.line,
            int(self.block_docs[k0]),
            int(self.block_docs[k1]),
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.window,
            groups=self.groups,
        )

    def _block_tokens(self, k: int) -> I64Array:
        """Places of each document of interleaved block k, in reading order."""
        held = self._memo.get(k)
        if held is None:
            plan = self._plan(k, k + 1)
            parts = [self.tokens[self.offsets[c.shards] + c.rows] for c in plan.chunks()]
            held = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            if len(self._memo) >= 4:
                self._memo.pop(next(iter(self._memo)))
            self._memo[k] = held
        return held

    def locate(self, place: int, last: bool = False) -> tuple[int, int, int]:
        """(block k, document d of the line, places of d before `place`) for the document
        holding place `place` (0 <= place < T); with `last`, of the document holding
        place ``place - 1`` (where a run ending at `place` ends)."""
        at = place - 1 if last else place
        if not 0 <= at < self.total:
            raise ValueError(f"place {place} is outside the epoch's {self.total} places")
        k = int(np.searchsorted(self.block_places, at, side="right")) - 1
        if not last and place == self.block_places[k]:
            # a block's first place: its first document (or an empty one before it, which
            # packs to nothing), found without ordering the block's documents
            return k, int(self.block_docs[k]), 0
        tokens = self._block_tokens(k)
        ends = np.cumsum(tokens) + self.block_places[k]
        i = int(np.searchsorted(ends, at, side="right"))
        start = int(ends[i]) - int(tokens[i])
        return k, int(self.block_docs[k]) + i, place - start

    def run(self, g0: int, g1: int, length: int) -> PackRun | None:
        """What blocks [g0, g1) of `length` places read (None when g0 == g1)."""
        if g1 <= g0:
            return None
        k0, d0, skip = self.locate(g0 * length)
        k1, d1, into = self.locate(g1 * length, last=True)
        plan = self._plan(k0, k1 + 1)
        base = int(self.block_docs[k0])
        # d1 holds places before the run's end `into` of its own
        rest = self._doc_tokens(k1, d1) - into
        return PackRun(plan, d0 - base, d1 + 1 - base, skip, rest, g1 - g0, g0)

    def _doc_tokens(self, k: int, d: int) -> int:
        return int(self._block_tokens(k)[d - int(self.block_docs[k])])
