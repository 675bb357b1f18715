"""What a part of a mixture epoch reads (pass pieces), and merging streams by the schedule.

A loader reads each stream's pieces with ``piece.plan.chunks(piece.start, piece.stop)`` and
takes records from the streams in the order the schedule's stream ids give.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..plan import Plan

__all__ = [
    "MixturePart",
    "PassPiece",
    "Taker",
    "merge_streams",
    "piece_records",
    "segment_parts",
]

I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class PassPiece:
    """Records [start, stop) of `plan` (in its reading order, ``plan.chunks(start, stop)``):
    part of pass `pass_index` of stream `stream`. `plan` is rank `rank`'s plan of that pass
    cut for `num_replicas` ranks, as ``ShardSampler(...).set_epoch(pass_index)`` then
    ``plan()`` gives it; after an elastic resume `rank` may be another (old) rank."""

    stream: int
    pass_index: int
    num_replicas: int
    rank: int
    plan: Plan
    start: int
    stop: int


@dataclass(frozen=True)
class MixturePart:
    """Positions [start, stop) of a rank's epoch, and what they read: stream k's records
    ``first[k]`` .. of its slice of the epoch, as `pieces[k]` in order."""

    epoch: int
    start: int
    stop: int
    first: tuple[int, ...]
    pieces: tuple[tuple[PassPiece, ...], ...]


def piece_records(pieces: Iterable[PassPiece], offsets: I64Array) -> Iterator[I64Array]:
    """Chunks of the pieces' record ids (shard offset + row, `offsets` (S,) per shard)."""
    for piece in pieces:
        for chunk in piece.plan.chunks(piece.start, piece.stop):
            yield offsets[chunk.shards] + chunk.rows


def merge_streams(
    ids: Iterable[I64Array], streams: Sequence[Iterator[I64Array]]
) -> Iterator[tuple[I64Array, I64Array]]:
    """(stream ids, values) chunks: each chunk of `ids` filled, in order, with the next
    values of the stream it names; each stream must hold as many values as `ids` asks."""
    takers = [Taker(s) for s in streams]
    for chunk in ids:
        out = np.empty(chunk.size, dtype=np.int64)
        for k, taker in enumerate(takers):
            # (n_k,) where this chunk reads stream k
            where = np.flatnonzero(chunk == k)
            out[where] = taker.take(where.size)
        yield chunk, out


class Taker:
    """Takes values from a stream of int64 arrays n at a time."""

    def __init__(self, arrays: Iterator[I64Array]) -> None:
        self._arrays, self._head = arrays, np.zeros(0, dtype=np.int64)

    def take(self, n: int) -> I64Array:
        parts = []
        while n > 0:
            if self._head.size == 0:
                self._head = next(self._arrays)
            parts.append(self._head[:n])
            n -= parts[-1].size
            self._head = self._head[parts[-1].size :]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def segment_parts(
    segments: Iterable[tuple[int, int, int, int]], planner_for: Any, root: Any
) -> Iterator[tuple[int, Any, MixturePart, Taker]]:
    """Per segment (rank, worker, a, b: positions [a, b) of that rank's epoch in the
    layout `root` the epoch started in), in order: its length, that rank's planner
    (``planner_for(root.num_replicas, rank)``: a MixtureSampler of the epoch), the part it
    reads and a Taker of its stream ids."""
    for rank, _, a, b in segments:
        planner = planner_for(root.num_replicas, rank)
        yield b - a, planner, planner.part(a, b), Taker(planner.stream_ids(a, b))
