"""One rank's plan, for `shardstream-plan --rank K`: its pieces (shard, rows, bytes), per
worker, computed without planning any other rank (O(shards) at any world size), and the
planning arguments the planner shares with ShardSampler."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import numpy as np

from shardstream.sampler.plan import DEFAULT_WINDOW
from shardstream.sampler.planning import build_plan

if TYPE_CHECKING:
    from shardstream.loader.index.shard_index import ShardIndex

__all__ = ["print_rank", "rank_doc", "settings", "sizes_of"]


def sizes_of(args: argparse.Namespace, index: ShardIndex | None) -> Any:
    if index is not None:
        return index.shard_sizes
    return np.full(args.simulate_shards, args.records_per_shard, dtype=np.int64)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The planning arguments of every rank, as ShardSampler passes them (no groups: the
    records and shards a rank reads do not depend on them)."""
    return {
        "seed": args.seed,
        "epoch": args.epoch,
        "shuffle": not args.no_shuffle,
        "drop_last": args.drop_last,
        "num_replicas": args.world_size,
        "window": DEFAULT_WINDOW if not args.no_shuffle else 1,
        "local_world_size": args.local_world_size if args.locality == "node" else None,
    }


def rank_doc(args: argparse.Namespace, index: ShardIndex | None) -> dict[str, Any]:
    """One rank's plan (each worker's pieces), the other ranks' never computed."""
    sizes = sizes_of(args, index)
    workers = []
    for w in range(args.workers):
        plan = build_plan(
            sizes, rank=args.rank, worker=w, num_workers=args.workers, **settings(args)
        )
        pieces = [
            {
                "shard": int(s),
                "url": None if index is None else index.shards[int(s)].url,
                "start": int(a),
                "stop": int(b),
                "bytes": None if index is None else index.bytes_for(int(s), int(a), int(b)),
            }
            for s, a, b in zip(plan.shards, plan.starts, plan.stops)
        ]
        workers.append({"worker": w, "records": len(plan), "pieces": pieces})
    return {
        "num_shards": len(sizes),
        "world_size": args.world_size,
        "rank": args.rank,
        "seed": args.seed,
        "epoch": args.epoch,
        "records": sum(w["records"] for w in workers),
        "workers": workers,
    }


def print_rank(doc: dict[str, Any]) -> None:
    print(
        f"rank {doc['rank']} of {doc['world_size']} over {doc['num_shards']:,} shards "
        f"(seed {doc['seed']}, epoch {doc['epoch']}): {doc['records']:,} records"
    )
    for w in doc["workers"]:
        print(f"worker {w['worker']}: {w['records']:,} records in {len(w['pieces'])} pieces")
        print(f"{'shard':>10} {'rows':>21} {'bytes':>14}  url")
        shown = (
            w["pieces"] if len(w["pieces"]) <= 40 else [*w["pieces"][:20], None, *w["pieces"][-20:]]
        )
        for piece in shown:
            if piece is None:
                print(f"{'...':>10}  ({len(w['pieces']) - 40} more; --json lists all)")
                continue
            b = "-" if piece["bytes"] is None else f"{piece['bytes']:,}"
            rows = f"{piece['start']:,}-{piece['stop']:,}"
            print(f"{piece['shard']:>10,} {rows:>21} {b:>14}  {piece['url'] or '-'}")
