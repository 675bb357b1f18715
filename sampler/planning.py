"""Making plans: an epoch's line (sampler.epoch) cut into each rank's and worker's span, and
that span as a `Plan` (sampler.plan) of pieces, keys and groups.

`build_plan` makes one worker's plan, `all_plans` every rank's and worker's at once (the
planner and the node cache's next-use plan read them all), `span_plan` the plan of any span
of the line (a mixture's passes), `plan_intervals` where a plan's records lie.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .epoch import (
    TAG_ROWS,
    EpochLine,
    epoch_line,
    node_line,
    rank_length,
    span_pieces,
    worker_span,
)
from .keyed import derive_key, derive_keys
from .plan import Groups, I64Array, Plan

__all__ = ["all_plans", "build_plan", "line_of", "piece_cuts", "plan_intervals", "span_plan"]


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
    groups: Groups | None = None,
    local_world_size: int | None = None,
) -> Plan:
    """The plan of one worker: a pure function of its arguments, O(shards) to compute
    (plus the groups of its own pieces). `local_world_size`: ranks per node, each node
    keeping its records every epoch (``locality="node"``, see `sampler.epoch.node_line`);
    None: the global reshuffle."""
    line = line_of(sizes, seed, epoch, shuffle, drop_last, num_replicas, local_world_size)
    length = rank_length(line.num_records, num_replicas, drop_last)
    lo, hi = worker_span(rank, length, worker, num_workers, align)
    return span_plan(
        line, lo, hi, seed=seed, epoch=epoch, shuffle=shuffle, window=window, groups=groups
    )


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
    groups: Groups | None = None,
    local_world_size: int | None = None,
    ranks: Sequence[int] | None = None,
) -> Iterator[tuple[int, int, Plan]]:
    """(rank, worker, plan) of every rank (or of `ranks`) and worker, the epoch line
    computed once: O(shards + ranks * workers * log shards) for all of them together."""
    line = line_of(sizes, seed, epoch, shuffle, drop_last, num_replicas, local_world_size)
    length = rank_length(line.num_records, num_replicas, drop_last)
    for rank in range(num_replicas) if ranks is None else ranks:
        for worker in range(num_workers):
            lo, hi = worker_span(rank, length, worker, num_workers)
            yield (
                rank,
                worker,
                span_plan(
                    line,
                    lo,
                    hi,
                    seed=seed,
                    epoch=epoch,
                    shuffle=shuffle,
                    window=window,
                    groups=groups,
                ),
            )


def line_of(
    sizes: I64Array,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    num_replicas: int,
    local_world_size: int | None = None,
) -> EpochLine:
    """The epoch's line: global (`epoch_line`) or, with `local_world_size`, nodes keeping
    their records (`node_line`)."""
    if local_world_size is None:
        return epoch_line(sizes, seed, epoch, shuffle)
    return node_line(sizes, seed, epoch, shuffle, drop_last, num_replicas, local_world_size)


def piece_cuts(groups: Sequence[int], start: int, stop: int) -> I64Array:
    """(G+1,) the rows where the groups of rows [start, stop) of a shard begin, then `stop`:
    the shard's group bounds (`groups`: records of each group) clipped to the range."""
    bounds = np.cumsum(np.asarray(groups, dtype=np.int64))
    inner = bounds[(bounds > start) & (bounds < stop)]
    return np.concatenate(([start], inner, [stop])).astype(np.int64)


def span_plan(
    line: EpochLine,
    lo: int,
    hi: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int,
    groups: Groups | None = None,
) -> Plan:
    """The plan reading line positions [lo, hi) of an epoch line computed once for many
    spans: O(log shards + pieces) per span, the same plan `build_plan` gives for that span."""
    shards, starts, stops = span_pieces(line, lo, hi)
    keys = derive_keys(derive_key(seed, epoch, TAG_ROWS), shards, starts) if shuffle else None
    cuts = None
    if groups is not None:
        cuts = tuple(
            piece_cuts(groups[int(s)], int(a), int(b)) for s, a, b in zip(shards, starts, stops)
        )
    return Plan(shards=shards, starts=starts, stops=stops, keys=keys, window=window, cuts=cuts)


def plan_intervals(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shards, starts, ends): per piece of the plan, its shard and the shares of the plan
    (in [0, 1]) read when its block of interleaved pieces starts and ends."""
    n = plan.shards.size
    total = len(plan)
    if n == 0 or total == 0:
        empty = np.zeros(0)
        return plan.shards[:0], empty, empty
    window = plan.window if plan.keys is not None else 1
    firsts = np.arange(0, n, window)
    before = np.concatenate(([0], np.cumsum(np.add.reduceat(plan.sizes, firsts))))
    block = np.arange(n) // window
    return plan.shards, before[block] / total, before[block + 1] / total
