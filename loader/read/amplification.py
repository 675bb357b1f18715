"""Read amplification at run time: a reader fetches whole read groups (Parquet row groups,
runs of tar members), so readers that share a group each fetch all of it. When a job has
more readers (ranks x DataLoader workers) than its shards' groups can split among them, a
worker fetches several times the bytes of its records; the planner shows it
(``shardstream-plan``), and the dataset says it once a job at run time (a WARNING from
rank 0, for the worst reader of any rank: every rank can compute every reader's span)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from shardstream.sampler import ShardSampler
from shardstream.sampler.epoch import rank_length, span_pieces, worker_span
from shardstream.sampler.planning import line_of

from ..index.shard_index import ShardIndex

__all__ = ["LIMIT", "Amplification", "job_amplification", "warning_text"]

log = logging.getLogger(__name__)

LIMIT = 1.5  # a factor above it is warned about
_MAX_READERS = 16384  # a job of more readers is measured on evenly spaced ranks

# (factor, bytes fetched, its records' share of their shards' bytes, rank, worker)
Amplification = tuple[float, int, int, int, int]


def _measure(
    index: ShardIndex, shards: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> tuple[int, float]:
    """(bytes the pieces' reads fetch, their records' share of their shards' bytes): a
    piece of k of a shard's n records holds k/n of what reading the shard whole fetches."""
    sizes = index.shard_sizes
    fetched, share = 0, 0.0
    for s, a, b in zip(shards.tolist(), starts.tolist(), stops.tolist()):
        fetched += index.bytes_for(s, a, b)
        share += index.bytes_for(s, 0, int(sizes[s])) * (b - a) / int(sizes[s])
    return fetched, share


def job_amplification(
    index: ShardIndex, sampler: ShardSampler, num_workers: int, align: int
) -> Amplification | None:
    """The worst reader of the job `sampler` plans (every rank, each of `num_workers`
    DataLoader workers, cuts at multiples of `align`, as the dataset cuts them) for its
    current epoch: only each reader's pieces (shard row ranges) are computed, O(shards +
    readers x log shards), never a record order. A job of over 16,384 readers is measured
    on evenly spaced ranks (the first and last among them). None when nothing is measured
    (no records, no byte counts)."""
    workers = max(1, num_workers)
    replicas = sampler.num_replicas
    line = line_of(
        sampler.sizes,
        sampler.seed,
        sampler.epoch,
        sampler.shuffle,
        sampler.drop_last,
        replicas,
        sampler.local_world_size,
    )
    length = rank_length(line.num_records, replicas, sampler.drop_last)
    ranks: Sequence[int] = range(replicas)
    if replicas * workers > _MAX_READERS:
        ranks = sorted(set(np.linspace(0, replicas - 1, _MAX_READERS // workers).astype(int)))
    worst: Amplification | None = None
    for rank in ranks:
        for worker in range(workers):
            lo, hi = worker_span(rank, length, worker, workers, align)
            fetched, share = _measure(index, *span_pieces(line, lo, hi))
            if share > 0 and (worst is None or fetched / share > worst[0]):
                worst = (fetched / share, fetched, round(share), int(rank), worker)
    return worst


def warning_text(worst: Amplification, ranks: int, workers: int) -> str:
    factor, fetched, share, rank, worker = worst
    readers = f"{ranks} rank{'s' * (ranks != 1)} x {max(1, workers)} DataLoader workers"
    who = f"rank {rank}" + (f", worker {worker}" if workers else "")
    return (
        f"read amplification {factor:.1f}x: the worst reader of this job ({readers}), "
        f"{who}, fetches {fetched:,} bytes for records holding {share:,} bytes of the "
        "shards, because "
        "readers share read groups (Parquet row groups, runs of tar members) and each "
        "fetches a group whole. Use fewer DataLoader workers, or write shards with more, "
        "smaller row groups (README: Writing shards); `shardstream-plan SOURCE "
        "--world-size R --workers W` shows the factor before a run. Warned once"
    )
