"""Read amplification at run time: a reader fetches whole read groups (Parquet row groups,
runs of tar members), so readers that share a group each fetch all of it. When a job has
more readers (ranks x DataLoader workers) than its shards' groups can split among them, a
worker fetches several times the bytes of its records; the planner shows it
(``shardstream-plan``), and the dataset says it once at run time (a WARNING)."""

from __future__ import annotations

import logging

from sampler.plan import Plan

from .index import ShardIndex

__all__ = ["LIMIT", "amplification", "warning_text"]

log = logging.getLogger(__name__)

LIMIT = 1.5  # a factor above it is warned about
_MAX_PIECES = 4096  # a plan of more pieces is not measured (its cost would grow startup)


def amplification(index: ShardIndex, plan: Plan) -> tuple[float, int, int] | None:
    """(factor, bytes the plan's reads fetch, bytes of its records' share of the stored
    bytes) for one worker's plan; None when it cannot be told cheaply (no records, no byte
    counts, or a plan of very many pieces, whose pieces are small against its share)."""
    if not len(plan) or len(plan.shards) > _MAX_PIECES or not index.num_records:
        return None
    stored = index.stored_bytes()
    share = stored * len(plan) // index.num_records
    if share <= 0:
        return None
    fetched = sum(
        index.bytes_for(int(s), int(a), int(b))
        for s, a, b in zip(plan.shards, plan.starts, plan.stops)
    )
    return fetched / share, fetched, share


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
