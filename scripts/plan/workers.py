"""Per rank and per worker figures for shardstream-plan: records, shards, the bytes a reader
fetches (every row group or tar range holding one of its records, whole) and its records'
share of the stored bytes, whose ratio is the reader's read amplification.

Bytes come from the index (`ShardIndex.bytes_for`) or, for `--simulate-shards` with
`--shard-bytes`, from a simulated uniform layout: every shard `--shard-bytes` bytes in row
groups of `--rows-per-group` rows (default: one group a shard, as pandas writes).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from shardstream.sampler.advice import fetched_rows
from shardstream.sampler.mixing import distinct_per_batch
from shardstream.sampler.planning import all_plans

from .rank import settings, sizes_of

if TYPE_CHECKING:
    from shardstream.loader.index.shard_index import ShardIndex

__all__ = ["RankRow", "WorkerRow", "layout_bytes", "plan_rows", "worst_worker"]

MIXING_RANKS = 4  # ranks sampled for the mixing metric
MIXING_RECORDS = 1 << 16  # records of each sampled rank it looks at

# (shards, starts, stops) of a plan's pieces -> (bytes fetched, the records' share)
Measure = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[int, int]]


@dataclass
class RankRow:
    rank: int
    records: int
    shards: int
    bytes: int | None  # fetched by the rank's workers together
    share_bytes: int | None  # its records' share of the stored bytes


@dataclass
class WorkerRow:
    rank: int
    worker: int
    records: int
    bytes: int | None
    share_bytes: int | None
    amplification: float | None  # bytes / share_bytes


def _index_measure(index: ShardIndex) -> Measure:
    sizes = index.shard_sizes
    whole: dict[int, int] = {}  # shard -> bytes reading it whole fetches

    def measure(shards: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[int, int]:
        fetched, share = 0, 0.0
        for s, a, b in zip(shards.tolist(), starts.tolist(), stops.tolist()):
            fetched += index.bytes_for(s, a, b)
            if s not in whole:
                whole[s] = index.bytes_for(s, 0, int(sizes[s]))
            share += whole[s] * (b - a) / int(sizes[s])
        return fetched, round(share)

    return measure


def _simulated_measure(rows: int, shard_bytes: int, group_rows: int) -> Measure:
    per_row = shard_bytes / rows

    def measure(shards: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[int, int]:
        fetched = int(fetched_rows(starts, stops, group_rows, rows).sum())
        return round(fetched * per_row), round(int((stops - starts).sum()) * per_row)

    return measure


def layout_bytes(args: argparse.Namespace, index: ShardIndex | None) -> Measure | None:
    """How a plan's bytes are measured: from the index, a simulated layout (with
    --shard-bytes), or not at all (None)."""
    if index is not None:
        return _index_measure(index)
    if args.shard_bytes is None:
        return None
    group = args.rows_per_group or args.records_per_shard
    return _simulated_measure(args.records_per_shard, args.shard_bytes, group)


def plan_rows(
    args: argparse.Namespace, index: ShardIndex | None
) -> tuple[list[RankRow], list[WorkerRow], float]:
    """Every rank's and worker's figures and the mixing metric (mean distinct shards in a
    batch of 64 consecutive records of a sample of ranks)."""
    sizes = sizes_of(args, index)
    measure = layout_bytes(args, index)
    known = measure is not None
    ranks = [
        RankRow(r, 0, 0, 0 if known else None, 0 if known else None) for r in range(args.world_size)
    ]
    workers: list[WorkerRow] = []
    touched: list[set[int]] = [set() for _ in range(args.world_size)]
    sampled = set(np.linspace(0, args.world_size - 1, MIXING_RANKS).astype(int).tolist())
    mixing = []
    plans = all_plans(sizes, num_workers=args.workers, **settings(args))
    total = args.world_size * args.workers
    for rank, worker, plan in tqdm(plans, total=total, desc="planning", disable=args.json):
        row = ranks[rank]
        row.records += len(plan)
        touched[rank].update(plan.shards.tolist())
        fetched = share = None
        if measure is not None:
            fetched, share = measure(plan.shards, plan.starts, plan.stops)
            row.bytes = (row.bytes or 0) + fetched
            row.share_bytes = (row.share_bytes or 0) + share
        amp = fetched / share if fetched is not None and share else None
        workers.append(WorkerRow(rank, worker, len(plan), fetched, share, amp))
        if rank in sampled and worker == 0 and len(plan):
            first = next(plan.chunks())
            mixing.append(distinct_per_batch(first.shards[:MIXING_RECORDS], 64))
    for row, shards in zip(ranks, touched):
        row.shards = len(shards)
    mixes = [m for m in mixing if m == m]  # drop NaN (ranks with under a batch)
    return ranks, workers, float(np.mean(mixes)) if mixes else float("nan")


def worst_worker(workers: list[WorkerRow]) -> dict[str, Any] | None:
    """The worker fetching the most over its share: rank, worker, amplification."""
    known = [w for w in workers if w.amplification is not None]
    if not known:
        return None
    w = max(known, key=lambda w: w.amplification or 0.0)
    return {"rank": w.rank, "worker": w.worker, "amplification": w.amplification}
