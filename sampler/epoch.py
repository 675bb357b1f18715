"""One epoch's arithmetic: shard order, the epoch line, and the spans cut from it.

The *epoch line* is every record of the dataset laid end to end, shard after shard in
the epoch's shard order (empty shards left out). A position on the line is a record;
positions at or past N (the number of records) are padding and wrap to position
``(p - N) % N``, the way torch's DistributedSampler pads with its first indices. Rank r
reads line positions ``[r * L, (r + 1) * L)`` (L records per rank); worker w of W reads a
contiguous part of that. Each span, mapped back to shards, is a list of *pieces*: one
shard and a contiguous range of its rows in storage order. All functions are pure and cost
O(shards), never O(records).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .keyed import derive_key, permute

__all__ = [
    "EpochLine",
    "epoch_line",
    "node_line",
    "rank_length",
    "shard_order",
    "span_pieces",
    "worker_span",
]

I64Array = npt.NDArray[np.int64]

# Tags keep the keys of different uses apart even when their other parts coincide.
TAG_SHARDS = 1
TAG_ROWS = 2
TAG_NODE = 6  # the order of a node's pieces (locality="node")


def rank_length(num_records: int, num_replicas: int, drop_last: bool) -> int:
    """Records per rank per epoch, as torch's DistributedSampler computes it."""
    if drop_last:
        return num_records // num_replicas
    return -(-num_records // num_replicas)


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> I64Array:
    """(S,) the shard id at each position of the epoch's shard order."""
    ids = np.arange(num_shards, dtype=np.int64)
    if not shuffle or num_shards <= 1:
        return ids
    return permute(ids, num_shards, derive_key(seed, epoch, TAG_SHARDS))


@dataclass(frozen=True)
class EpochLine:
    """The epoch's line: non-empty shards (or shard row ranges) in order and where each
    one ends on the line."""

    shards: I64Array  # (S',) shard id of each non-empty shard, in line order
    ends: I64Array  # (S',) line position one past that shard's last record
    # (S',) the shard row each element starts at (a node line's elements are pieces of
    # shards); None: every element is a whole shard, from row 0
    bases: I64Array | None = None

    @property
    def num_records(self) -> int:
        return int(self.ends[-1]) if self.ends.size else 0


def epoch_line(sizes: I64Array, seed: int, epoch: int, shuffle: bool) -> EpochLine:
    """The line for one epoch; `sizes` (S,) are records per shard in storage order."""
    # (S,) shard ids in epoch order
    order = shard_order(sizes.size, seed, epoch, shuffle)
    # (S',) the non-empty ones: an empty shard holds no position on the line
    order = order[sizes[order] > 0]
    return EpochLine(shards=order, ends=np.cumsum(sizes[order], dtype=np.int64))


def worker_span(
    rank: int, length: int, worker: int, num_workers: int, align: int = 1
) -> tuple[int, int]:
    """Line positions [lo, hi) of a worker: the rank's span cut in `num_workers` near-equal
    parts, each cut at a multiple of `align` records (a batch size) from the span's start."""
    units = -(-length // align)  # (whole or short) units of `align` records in the span
    base = rank * length
    lo = min(length, align * (units * worker // num_workers))
    hi = min(length, align * (units * (worker + 1) // num_workers))
    return base + lo, base + hi


def _real_pieces(line: EpochLine, lo: int, hi: int) -> tuple[I64Array, I64Array, I64Array]:
    """Pieces covering real positions [lo, hi), 0 <= lo <= hi <= N."""
    if lo >= hi:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    # i0..i1-1: the shards of the line that hold a position in [lo, hi)
    i0 = int(np.searchsorted(line.ends, lo, side="right"))
    i1 = int(np.searchsorted(line.ends, hi - 1, side="right")) + 1
    ends = line.ends[i0:i1]
    # where each of those shards begins on the line
    begins = np.concatenate(([line.ends[i0 - 1] if i0 else 0], ends[:-1]))
    # rows of each shard inside the span, in storage order
    starts = np.maximum(begins, lo) - begins
    stops = np.minimum(ends, hi) - begins
    if line.bases is not None:
        starts, stops = starts + line.bases[i0:i1], stops + line.bases[i0:i1]
    return line.shards[i0:i1].copy(), starts, stops


def span_pieces(line: EpochLine, lo: int, hi: int) -> tuple[I64Array, I64Array, I64Array]:
    """(shards, starts, stops), each (P,): the pieces covering line positions [lo, hi).

    Positions past the end of the line are padding; they wrap to the line's start (and
    around again while the padding is longer than the line), so a padded span is the real
    pieces followed by pieces of the first shards of the line.
    """
    n = line.num_records
    parts = [_real_pieces(line, min(lo, n), min(hi, n))]
    # padding: positions [max(lo, n), hi) wrap to (p - n) % n, in runs that do not wrap
    pos = max(lo, n)
    while pos < hi and n > 0:
        q = (pos - n) % n
        take = min(hi - pos, n - q)
        parts.append(_real_pieces(line, q, q + take))
        pos += take
    shards, starts, stops = (np.concatenate([p[k] for p in parts]) for k in range(3))
    return shards.astype(np.int64), starts.astype(np.int64), stops.astype(np.int64)


def node_line(
    sizes: I64Array,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    num_replicas: int,
    local_world_size: int,
) -> EpochLine:
    """The line for one epoch with ``locality="node"``: nodes of `local_world_size`
    consecutive ranks each keep the same records every epoch.

    Epoch 0's line is cut once into one span per node (``local_world_size * L`` positions,
    L records per rank, padding included), each span into its pieces; each epoch lays every
    node's pieces out in a keyed order of (seed, epoch, node) and the nodes' lines end to
    end. Cutting that line into ranks' spans of L gives each node's ranks exactly their
    node's records, reshuffled across the node's ranks each epoch: equal counts and exactly
    once an epoch hold as for `epoch_line` (padding is the epoch-0 padding, every epoch);
    with `drop_last` the records past ``R * L`` are those of epoch 0's line, every epoch.
    O(shards) per epoch.
    """
    if num_replicas % local_world_size:
        raise ValueError(
            f"locality='node' needs num_replicas ({num_replicas}) to be a multiple of "
            f"local_world_size ({local_world_size}): nodes of equal size"
        )
    first = epoch_line(sizes, seed, 0, shuffle)
    span = local_world_size * rank_length(first.num_records, num_replicas, drop_last)
    shards, starts, ends = [], [], []
    for node in range(num_replicas // local_world_size):
        s, a, b = span_pieces(first, node * span, (node + 1) * span)
        if shuffle and s.size > 1:
            order = permute(np.arange(s.size), s.size, derive_key(seed, epoch, TAG_NODE, node))
            s, a, b = s[order], a[order], b[order]
        shards.append(s)
        starts.append(a)
        ends.append(b - a)
    if not shards:
        return EpochLine(first.shards[:0], first.ends[:0], first.ends[:0])
    lengths = np.concatenate(ends)
    return EpochLine(
        shards=np.concatenate(shards),
        ends=np.cumsum(lengths, dtype=np.int64),
        bases=np.concatenate(starts).astype(np.int64),
    )
