"""Mixtures weighted in tokens: each stream packed on its own, its blocks mixed by count.

A block holds `length` tokens of one stream (documents of two streams never share one), so
weighing streams by tokens is weighing them by blocks. The mixture's planner
(sampler.MixtureSampler) is given, per stream, one pseudo-shard of B_k records, B_k being
the blocks of one pass of the stream's token line (loader.tokens.packing; pass p is that
line at epoch p, under the stream's own seed), with `shuffle` off (a rank's blocks of a
pass are a contiguous range of it, read as one run) and `drop_last` on (no block twice in
a pass). Everything the planner promises about records then holds for blocks: c_k blocks
of stream k per rank and epoch by the weights (largest remainder, so within one block of
the weights' share per rank and epoch), the stratified schedule, whole passes before any
repeat, and resume and elastic resume by a few integers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.sampler.mixture.read import segment_parts
from shardstream.sampler.packing import PackLine
from shardstream.sampler.resume import Segment

from ..errors import ShardError
from ..read.plan_reader import PlanReader
from .packer import Blocks
from .packing import Packing

__all__ = ["BlockQueue", "Lines", "mixed_blocks", "pseudo_sizes"]

I64 = npt.NDArray[np.int64]
_LINES = 4  # token lines (stream, pass) kept for reuse


def pseudo_sizes(packings: Sequence[Packing]) -> list[list[int]]:
    """Per stream, its one pseudo-shard: the blocks of one pass of its token line."""
    return [[p.blocks] for p in packings]


class BlockQueue:
    """One stream's blocks in order, taken a few at a time."""

    def __init__(self, blocks: Iterator[Blocks], name: str) -> None:
        self._blocks = blocks
        self._held: Blocks | None = None
        self.name = name

    def take(self, n: int) -> Blocks:
        """The next n blocks, as (n, length) arrays."""
        out: list[Blocks] = []
        while n > 0:
            if self._held is None or not self._held[0].shape[0]:
                got = next(self._blocks, None)
                if got is None:
                    raise ShardError(f"stream {self.name!r} ran out of blocks: its plan is wrong")
                self._held = got
            k = min(n, self._held[0].shape[0])
            tokens, positions, document = self._held
            out.append((tokens[:k], positions[:k], document[:k]))
            self._held = (tokens[k:], positions[k:], document[k:])
            n -= k
        if len(out) == 1:
            return out[0]
        tokens, positions, document = (np.concatenate(arrays) for arrays in zip(*out))
        return tokens, positions, document


class Lines:
    """Token lines by (stream, pass), the last few kept."""

    def __init__(
        self, packings: Sequence[Packing], groups: Sequence[Any], shuffle: bool, window: int
    ) -> None:
        self.packings = packings
        self.groups = groups  # per stream, its shards' read groups
        self.shuffle = shuffle
        self.window = window
        self._held: OrderedDict[tuple[int, int], PackLine] = OrderedDict()

    def get(self, k: int, pass_index: int, seed: int) -> PackLine:
        key = (k, pass_index)
        if key not in self._held:
            self._held[key] = self.packings[k].line(
                seed, pass_index, self.shuffle, self.window, self.groups[k]
            )
            if len(self._held) > _LINES:
                self._held.popitem(last=False)
        self._held.move_to_end(key)
        return self._held[key]


def _stream_blocks(
    k: int, pieces: Sequence[Any], planner: Any, lines: Lines, reader: PlanReader
) -> Iterator[Blocks]:
    """Stream k's blocks of a part: each pass piece is a contiguous range of blocks of
    that pass's token line (its plan's one piece, a range of the pseudo-shard)."""
    packing = lines.packings[k]
    for piece in pieces:
        base = int(piece.plan.starts[0])
        line = lines.get(k, piece.pass_index, planner.seeds[k])
        run = line.run(base + piece.start, base + piece.stop, packing.pack.length)
        if run is not None:
            yield from packing.blocks_of(reader, [run])


def mixed_blocks(
    segments: Sequence[Segment],
    planner_for: Any,
    root: Any,
    lines: Lines,
    readers: Sequence[PlanReader],
    names: Sequence[str],
    step: int,
) -> Iterator[tuple[I64, I64, I64, I64]]:
    """The segments' positions in order as blocks and the stream index of each, at most
    `step` positions a chunk. `planner_for(num_replicas, rank)`: the epoch's MixtureSampler of
    that rank in the layout the epoch started in (`root`)."""
    for left, planner, part, ids in segment_parts(segments, planner_for, root):
        queues = [
            BlockQueue(_stream_blocks(k, part.pieces[k], planner, lines, reader), names[k])
            for k, reader in enumerate(readers)
        ]
        while left > 0:
            n = min(left, step)
            which = ids.take(n)
            rows = [np.empty((n, lines.packings[0].pack.length), dtype=np.int64) for _ in range(3)]
            for k, queue in enumerate(queues):
                at = np.flatnonzero(which == k)
                if at.size:
                    got = queue.take(int(at.size))
                    for out, src in zip(rows, got):
                        out[at] = src
            yield rows[0], rows[1], rows[2], which.astype(np.int64)
            left -= n
