"""Measure ShardSampler's planning cost and mixing.

    python -m scripts.bench.sampler [--shards 1000000] [--ranks 4096] [--json]
        [--mixture-streams 3] [--mixture-shards 300000] [--mixture-only]

Reports, for one rank of --ranks over --shards shards of 10,000 records: wall time and
traced peak memory (tracemalloc) of building the rank's plan and of seeking to its end;
then the mixing metric (mean distinct shards per batch of 64) for several windows and
shard sizes, and the rate at which ids are generated. The mixture row plans a
MixtureSampler of --mixture-streams streams of --mixture-shards shards each (random sizes,
1,000-20,000 records) over --ranks ranks, for rank 0 and for the last rank: construction,
set_epoch, the 8 worker ranges and pass pieces (batches of 1024), and a seek to the middle
of the epoch; then the same for the epoch's rest after an elastic resume to half the ranks.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from typing import Any

import numpy as np

from shardstream.sampler import DEFAULT_WINDOW, MixtureSampler, ShardSampler, distinct_per_batch


def planning(shards: int, ranks: int, records_per_shard: int) -> dict[str, float]:
    sizes = np.full(shards, records_per_shard, dtype=np.int64)
    tracemalloc.start()
    t0 = time.perf_counter()
    sampler = ShardSampler(sizes, ranks, ranks - 1, seed=0)
    plan = sampler.plan()
    t1 = time.perf_counter()
    next(plan.chunks(len(plan) - 1))
    t2 = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "shards": shards,
        "ranks": ranks,
        "records": int(sizes.sum()),
        "rank_records": len(plan),
        "rank_pieces": int(plan.shards.size),
        "plan_s": t1 - t0,
        "seek_to_end_s": t2 - t1,
        "peak_traced_mib": peak / 2**20,
        "input_sizes_mib": sizes.nbytes / 2**20,
    }


def mixing(window: int, records_per_shard: int, shards: int = 256) -> dict[str, float]:
    sampler = ShardSampler([records_per_shard] * shards, 4, 0, seed=0, window=window)
    t0 = time.perf_counter()
    ids = np.fromiter(iter(sampler), dtype=np.int64, count=len(sampler))
    dt = time.perf_counter() - t0
    return {
        "window": window,
        "records_per_shard": records_per_shard,
        "distinct_shards_per_64": distinct_per_batch(ids // records_per_shard, 64),
        "ids_per_s": len(ids) / dt,
    }


def _timed(stages: dict[str, Any], name: str, t0: float) -> float:
    now = time.perf_counter()
    stages[name] = now - t0
    return now


def mixture_rank(sizes: list[np.ndarray], ranks: int, rank: int, workers: int = 8) -> dict:
    """Plan one rank of a mixture as its own process would, then the epoch's rest after an
    elastic resume to half the ranks; times per stage and the traced peak."""
    weights = [0.6, 0.3, 0.1, *([0.1] * max(0, len(sizes) - 3))][: len(sizes)]
    row: dict[str, Any] = {"rank": rank}
    tracemalloc.start()
    t = time.perf_counter()
    sampler = MixtureSampler(sizes, weights, num_replicas=ranks, rank=rank, seed=0)
    t = _timed(row, "construct_s", t)
    sampler.set_epoch(3)
    t = _timed(row, "set_epoch_s", t)
    parts = [sampler.worker_part(w, workers, align=1024) for w in range(workers)]
    t = _timed(row, f"{workers}_worker_parts_s", t)
    mid = len(sampler) // 2
    first = next(sampler.read(mid, mid + 1024))
    t = _timed(row, "seek_middle_s", t)
    _, row["peak_traced_mib"] = tracemalloc.get_traced_memory()
    row["peak_traced_mib"] /= 2**20
    state = {**sampler.state_dict(), "position": mid}
    row["rank_records"] = len(sampler)
    del sampler
    tracemalloc.reset_peak()
    t = time.perf_counter()
    resized = MixtureSampler(sizes, weights, num_replicas=ranks // 2, rank=rank // 2, seed=0)
    resized.load_state_dict(state)
    rest = resized.worker_part(0, 1)
    _timed(row, "elastic_rest_s", t)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row["elastic_peak_mib"] = peak / 2**20
    row["pass_pieces"] = sum(len(p) for part in parts for p in part.pieces)
    row["elastic_rest_records"] = len(resized)
    row["elastic_pass_pieces"] = sum(len(p) for p in rest.pieces)
    assert first[0].size == 1024
    return row


def mixture_planning(streams: int, shards: int, ranks: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    sizes = [rng.integers(1000, 20_001, size=shards) for _ in range(streams)]
    return {
        "streams": streams,
        "shards_per_stream": shards,
        "ranks": ranks,
        "records": int(sum(int(s.sum()) for s in sizes)),
        "input_sizes_mib": sum(s.nbytes for s in sizes) / 2**20,
        "per_rank": [mixture_rank(sizes, ranks, r) for r in (0, ranks - 1)],
    }


def _show(title: str, row: dict[str, Any]) -> None:
    print(title)
    for key, value in row.items():
        if isinstance(value, list):
            for sub in value:
                _show(f"  {key}:", sub)
            continue
        print(
            f"  {key:>20}: {value:,.3f}" if isinstance(value, float) else f"  {key:>20}: {value:,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.sampler", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--records-per-shard", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--mixture-streams", type=int, default=3)
    parser.add_argument("--mixture-shards", type=int, default=300_000)
    parser.add_argument("--mixture-only", action="store_true", help="only the mixture row")
    args = parser.parse_args()
    mixture = mixture_planning(args.mixture_streams, args.mixture_shards, args.ranks)
    if args.mixture_only:
        if args.json:
            print(json.dumps({"mixture": mixture}, indent=2))
        else:
            _show("mixture planning (rank 0 and the last rank):", mixture)
        return
    plan = planning(args.shards, args.ranks, args.records_per_shard)
    mixes = [mixing(w, n) for n in (100, 1000, 10_000) for w in (1, 4, DEFAULT_WINDOW, 16)]
    if args.json:
        print(json.dumps({"planning": plan, "mixing": mixes, "mixture": mixture}, indent=2))
        return
    _show("planning one rank (the last):", plan)
    _show("\nmixture planning (rank 0 and the last rank):", mixture)
    print(f"\nmixing (4 ranks, rank 0, 256 shards; default window {DEFAULT_WINDOW}):")
    print(f"  {'records/shard':>13} {'window':>6} {'distinct/64':>11} {'ids/s':>12}")
    for m in mixes:
        print(
            f"  {m['records_per_shard']:>13,} {m['window']:>6} "
            f"{m['distinct_shards_per_64']:>11.2f} {m['ids_per_s']:>12,.0f}"
        )


if __name__ == "__main__":
    main()
