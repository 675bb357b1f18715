"""Measure ShardSampler's planning cost and mixing.

    python scripts/bench_sampler.py [--shards 1000000] [--ranks 4096] [--json]

Reports, for one rank of --ranks over --shards shards of 10,000 records: wall time and
traced peak memory (tracemalloc) of building the rank's plan and of seeking to its end;
then the mixing metric (mean distinct shards per batch of 64) for several windows and
shard sizes, and the rate at which ids are generated.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from sampler import DEFAULT_WINDOW, ShardSampler, distinct_per_batch


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--records-per-shard", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    plan = planning(args.shards, args.ranks, args.records_per_shard)
    mixes = [mixing(w, n) for n in (100, 1000, 10_000) for w in (1, 4, DEFAULT_WINDOW, 16)]
    if args.json:
        print(json.dumps({"planning": plan, "mixing": mixes}, indent=2))
        return
    print("planning one rank (the last):")
    for key, value in plan.items():
        print(
            f"  {key:>18}: {value:,.3f}" if isinstance(value, float) else f"  {key:>18}: {value:,}"
        )
    print(f"\nmixing (4 ranks, rank 0, 256 shards; default window {DEFAULT_WINDOW}):")
    print(f"  {'records/shard':>13} {'window':>6} {'distinct/64':>11} {'ids/s':>12}")
    for m in mixes:
        print(
            f"  {m['records_per_shard']:>13,} {m['window']:>6} "
            f"{m['distinct_shards_per_64']:>11.2f} {m['ids_per_s']:>12,.0f}"
        )


if __name__ == "__main__":
    main()
