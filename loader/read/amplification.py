"""Read amplification at run time: a reader fetches whole read groups (Parquet row groups,
runs of tar members), so readers that share a group each fetch all of it. When a job has
more readers (ranks x DataLoader workers) than its shards' groups can split among them, a
worker fetches several times the bytes of its records; the planner shows it
(``shardstream-plan``), and the dataset says it once at run time (a WARNING)."""

from __future__ import annotations

import logging

from sampler.plan import Plan

from ..index.shard_index import ShardIndex

__all__ = ["LIMIT", "amplification", "warning_text"]

log = logging.getLogger(__name__)

LIMIT = 1.5  # a factor above it is warned about
_MAX_PIECES = 4096  # a plan of more pieces is not measured (its cost would grow startup)


def amplification(index: ShardIndex, plan: Plan) -> tuple[float, int, int] | None:
    """(factor, bytes the plan's reads fetch, its records' share of their shards' bytes)
    for one worker's plan: a piece of k of a shard's n records holds k/n of what reading
    the shard whole fetches. Only the plan's shards are looked at. None when it cannot be
    told cheaply (no records, no byte counts, or a plan of very many pieces, whose pieces
    are small against its share)."""
    if not len(plan) or len(plan.shards) > _MAX_PIECES:
        return None
    sizes = index.shard_sizes
    fetched, share = 0, 0.0
    for s, a, b in zip(plan.shards.tolist(), plan.starts.tolist(), plan.stops.tolist()):
        fetched += index.bytes_for(s, a, b)
        share += index.bytes_for(s, 0, int(sizes[s])) * (b - a) / int(sizes[s])
    if share <= 0:
        return None
    return fetched / share, fetched, round(share)


def warning_text(factor: float, fetched: int, share: int, ranks: int, workers: int) -> str:
    readers = f"{ranks} ranks x {max(1, workers)} DataLoader workers"
    return (
        f"read amplification {factor:.1f}x: a reader of this job ({readers}) fetches "
        f"{fetched:,} bytes for records holding {share:,} bytes of the shards, because "
        "readers share read groups (Parquet row groups, runs of tar members) and each "
        "fetches a group whole. Use fewer DataLoader workers, or write shards with more, "
        "smaller row groups (README: Writing shards); `shardstream-plan SOURCE "
        "--world-size R --workers W` shows the factor before a run. Warned once"
    )
