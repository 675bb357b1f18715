"""`shardstream-plan --epochs E --cache-limit 50GB`: what a node cache saves, simulated.

For each node (`--local-world-size` consecutive ranks) and epoch, the node's reads come
from the plans (no data is read): each shard the node's ranks and workers read, when
(the share of its worker's plan read before its block of pieces starts) and how many
stored bytes (the node's rows of it, in proportion). A cache of `--cache-limit` bytes
then serves them, by next use (what loader.cache.node does: the byte needed furthest ahead is
evicted first, and bytes needed later than everything held are not kept) and by LRU for
comparison; a shard's bytes may be held in part, as the cache holds a shard's blocks.
The tables give the bytes each policy fetches from remote storage, per node and epoch.

The simulation costs O(the node's shards) per node and epoch, in Python; at 4,096 ranks
the first `--sim-nodes` nodes (default 8) are simulated, the others are alike.
"""

from __future__ import annotations

import argparse
import heapq
from collections import OrderedDict
from typing import Any

import numpy as np

from shardstream.sampler.planning import all_plans, plan_intervals

__all__ = ["cache_doc", "node_reads", "print_cache", "simulate"]

DEFAULT_SIM_NODES = 8

# per epoch: (shards, first times, bytes) of the node's reads, sorted by time
Reads = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def node_reads(
    sizes: np.ndarray,
    shard_bytes: np.ndarray,
    settings: dict[str, Any],
    epochs: int,
    local: int,
    nodes: list[int],
    workers: int,
) -> dict[int, Reads]:
    """Per node of `nodes`, per epoch, the shards it reads, when first, and how many
    stored bytes (its rows' share of the shard's bytes); `settings` are the planning
    arguments (with ``local_world_size`` for locality="node")."""
    per_byte = np.divide(shard_bytes, np.maximum(sizes, 1))
    out: dict[int, Reads] = {n: [] for n in nodes}
    ranks = [r for n in nodes for r in range(n * local, (n + 1) * local)]
    for epoch in range(epochs):
        found: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {n: [] for n in nodes}
        plans = all_plans(
            sizes,
            **{**settings, "epoch": epoch},
            num_workers=workers,
            ranks=ranks,
        )
        for rank, _, plan in plans:
            shards, starts, _ = plan_intervals(plan)
            found[rank // local].append((shards, starts, plan.sizes * per_byte[shards]))
        for n in nodes:
            s = np.concatenate([f[0] for f in found[n]])
            t = np.concatenate([f[1] for f in found[n]])
            b = np.concatenate([f[2] for f in found[n]])
            # one read a shard: its first time, the bytes of all its pieces
            order = np.lexsort((t, s))
            s, t, b = s[order], t[order], b[order]
            first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
            total = np.add.reduceat(b, first) if first.size else b[:0]
            s, t = s[first], t[first]
            by_time = np.argsort(t, kind="stable")
            out[n].append((s[by_time], t[by_time] + epoch, total[by_time]))
    return out


def simulate(reads: Reads, limit: float | None, policy: str) -> list[float]:
    """Bytes fetched each epoch by a cache of `limit` bytes (None: no bound)."""
    shards = np.concatenate([r[0] for r in reads]) if reads else np.zeros(0, dtype=np.int64)
    need = np.concatenate([r[2] for r in reads]) if reads else np.zeros(0)
    epoch_of = np.concatenate([np.full(r[0].size, e) for e, r in enumerate(reads)])
    n = shards.size
    # the index of each read's next read of the same shard (n: none)
    following = np.full(n, n, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        s = int(shards[i])
        following[i] = last.get(s, n)
        last[s] = i
    fetched = [0.0] * len(reads)
    held: dict[int, float] = {}  # shard -> bytes of it held
    total = 0.0
    heap: list[tuple[int, int]] = []  # (-next read, shard); stale entries are skipped
    upcoming: dict[int, int] = {}  # shard held -> its next read
    lru: OrderedDict[int, None] = OrderedDict()
    for i in range(n):
        s, want = int(shards[i]), float(need[i])
        have = held.pop(s, 0.0)
        total -= have
        upcoming.pop(s, None)
        lru.pop(s, None)
        fetched[int(epoch_of[i])] += max(0.0, want - have)
        keep = max(have, want)
        nxt = int(following[i])
        if limit is not None:
            if policy == "lru":
                while total + keep > limit and lru:
                    victim, _ = lru.popitem(last=False)
                    total -= held.pop(victim)
            else:
                while total + keep > limit and heap:
                    far, victim = heap[0]
                    if upcoming.get(victim) != -far:
                        heapq.heappop(heap)  # stale
                        continue
                    if -far <= nxt:
                        break  # everything held is needed before this shard is again
                    heapq.heappop(heap)
                    total -= held.pop(victim)
                    del upcoming[victim]
            keep = max(0.0, min(keep, limit - total))
        if keep > 0 and (policy == "lru" or nxt < n):  # next use: not if never read again
            held[s] = keep
            total += keep
            lru[s] = None
            upcoming[s] = nxt
            heapq.heappush(heap, (-nxt, s))
    return fetched


def cache_doc(
    args: argparse.Namespace, sizes: np.ndarray, shard_bytes: np.ndarray, settings: dict[str, Any]
) -> dict[str, Any]:
    """Per simulated node and epoch: the node's share (bytes it reads), and what next-use
    eviction and LRU fetch from remote storage with the cache limit."""
    local = args.local_world_size
    num_nodes = args.world_size // local
    nodes = list(range(min(num_nodes, args.sim_nodes)))
    reads = node_reads(sizes, shard_bytes, settings, args.epochs, local, nodes, args.workers)
    rows = []
    for n in nodes:
        best = simulate(reads[n], args.cache_limit, "next-use")
        lru = simulate(reads[n], args.cache_limit, "lru")
        for e, (_, _, b) in enumerate(reads[n]):
            rows.append(
                {"node": n, "epoch": e, "share": float(b.sum()), "next_use": best[e], "lru": lru[e]}
            )
    return {
        "nodes": num_nodes,
        "simulated_nodes": len(nodes),
        "local_world_size": local,
        "epochs": args.epochs,
        "cache_limit": args.cache_limit,
        "locality": args.locality,
        "per_node_epoch": rows,
    }


def print_cache(doc: dict[str, Any]) -> None:
    from .plot import human_bytes

    limit = doc["cache_limit"]
    print(
        f"node cache: {doc['nodes']} nodes of {doc['local_world_size']} ranks, "
        f"{doc['epochs']} epochs, limit {human_bytes(limit) if limit else 'none'}, locality "
        f"{doc['locality'] or 'none (global reshuffle)'}"
    )
    if doc["simulated_nodes"] < doc["nodes"]:
        print(f"(nodes 0-{doc['simulated_nodes'] - 1} simulated; --sim-nodes N for more)")
    print(f"{'node':>5} {'epoch':>5} {'node reads':>12} {'next-use':>12} {'LRU':>12}")
    for r in doc["per_node_epoch"]:
        print(
            f"{r['node']:>5} {r['epoch']:>5} {human_bytes(r['share']):>12} "
            f"{human_bytes(r['next_use']):>12} {human_bytes(r['lru']):>12}"
        )
    rows = doc["per_node_epoch"]
    later = [r for r in rows if r["epoch"] > 0]
    if later:
        share = sum(r["share"] for r in later)
        best = sum(r["next_use"] for r in later) / share
        lru = sum(r["lru"] for r in later) / share
        print(f"epochs 1+: next-use fetches {best:.0%} of what the nodes read, LRU {lru:.0%}")
