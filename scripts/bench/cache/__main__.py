"""Several epochs from S3 with a node cache: what later epochs fetch, and at what speed.

    python -m scripts.bench.cache [--shards 32] [--per-shard 4000] [--epochs 3] [--json]

A Parquet dataset (scripts.bench's records) in a moto S3 bucket behind the shaping proxy
(30 ms to first byte, 100 MB/s a connection: an object store), read by 4 ranks on 2 nodes
(one process a rank, the ranks of an epoch at once; each node its own cache folder):

1. ``locality="node"``, no limit: bytes fetched per epoch (epochs 1+ against epoch 0) and
   records/s against the same ranks reading the same shards from local disk;
2. ``cache_limit`` at half a node's share, next-use eviction and LRU: bytes fetched per
   epoch against the share;
3. ``locality=None`` with a cache: what epoch 1 fetches (other shards each epoch);
4. what locality costs in randomness: distinct shards per batch of 256 and the rank
   correlation between a record's row and its place in its shard's stream (issue 12's
   measure), against the global shuffle; and the share of a node's records that are the
   same as the epoch before.

Each rank is one process reading every epoch, as a training job does (the ranks drift
apart a little; no barrier between epochs). Records/s and CPU seconds per record are per
rank (the mean over ranks); fetched bytes are the ranks' `bytes_fetched` (GET bodies from
S3), summed over the nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from scripts.bench import REPO

WORLD, LOCAL = 4, 2  # 4 ranks on 2 nodes
BATCH = 256


def rank_main(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One rank's epochs, in its own process (as a training job runs them): per epoch its
    records, seconds, CPU seconds and what it fetched from S3 and from the cache."""
    import dataclasses

    from shardstream.loader import ShardIndex, StreamingDataset

    index = ShardIndex.load(spec["index"])
    ds = StreamingDataset(
        index,
        num_replicas=WORLD,
        rank=spec["rank"],
        seed=0,
        batch_size=BATCH,
        columns=["id", "tokens", "text"],
        storage_options=spec["options"],
        cache_dir=spec["cache"],
        cache_limit=spec["limit"],
        locality=spec["locality"],
        local_world_size=LOCAL,
    )
    if spec["policy"] != "next-use":
        ds.node = dataclasses.replace(ds.node, policy=spec["policy"])
    out = []
    for epoch in range(spec["epochs"]):
        barrier(Path(spec["barrier"]), epoch, spec["rank"])
        ds.set_epoch(epoch)
        ds.reset_stats()
        t0, c0 = time.perf_counter(), time.process_time()
        records = sum(len(b["id"]) for b in ds)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        stats = ds.stats()
        out.append(
            {
                "records": records,
                "wall_s": wall,
                "cpu_s": cpu,
                "bytes_fetched": stats["bytes_fetched"],
                "cache_hit_bytes": stats["cache_hit_bytes"],
            }
        )
    return out


def barrier(folder: Path, epoch: int, rank: int) -> None:
    """Wait until every rank has reached `epoch` (a file each, as a job's barrier would):
    the bytes fetched in an epoch are then that epoch's."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{epoch}-{rank}").touch()
    while len(list(folder.glob(f"{epoch}-*"))) < WORLD:
        time.sleep(0.01)


def held(folder: Path) -> int:
    """Bytes of cache blocks in a node's folder."""
    return sum(p.stat().st_size for p in folder.glob("*.blk")) if folder.is_dir() else 0


def run_epochs(spec: dict[str, Any], epochs: int, label: str) -> list[dict[str, Any]]:
    """All 4 ranks at once (a process each, each reading every epoch); per epoch the bytes
    fetched (summed over ranks), records/s a rank, CPU us a record, and what the nodes'
    folders hold at the end."""
    procs = []
    gate = tempfile.mkdtemp(prefix="barrier_")
    for rank in range(WORLD):
        cache = None if spec["cache"] is None else f"{spec['cache']}/node{rank // LOCAL}"
        mine = {**spec, "rank": rank, "cache": cache, "epochs": epochs, "barrier": gate}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "scripts.bench.cache", "--rank-spec", json.dumps(mine)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    ranks = []
    for p in tqdm(procs, desc=label, leave=False):
        out, _ = p.communicate(timeout=900)
        if p.returncode:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for e in range(epochs):
        per = [r[e] for r in ranks]
        records = sum(r["records"] for r in per)
        rows.append(
            {
                "fetched": sum(r["bytes_fetched"] for r in per),
                "hit": sum(r["cache_hit_bytes"] for r in per),
                "records_per_s": float(np.mean([r["records"] / r["wall_s"] for r in per])),
                "cpu_us_per_record": 1e6 * sum(r["cpu_s"] for r in per) / max(1, records),
            }
        )
    if spec["cache"] is not None:
        rows[-1]["held"] = sum(
            held(Path(spec["cache"]) / f"node{n}") for n in range(WORLD // LOCAL)
        )
    return rows


def randomness(sizes: np.ndarray) -> dict[str, dict[str, float]]:
    """Distinct shards per batch, |rank correlation| of row against place, node overlap."""
    from shardstream.sampler import ShardSampler, distinct_per_batch

    out = {}
    for name, local in (("global shuffle", None), ('locality="node"', LOCAL)):
        mix, rhos, kept = [], [], []
        before = None
        for e in range(3):
            node = set()
            for rank in range(WORLD):
                s = ShardSampler(sizes, WORLD, rank, seed=0, local_world_size=local)
                s.set_epoch(e)
                chunks = list(s.plan().chunks())
                shard = np.concatenate([c.shards for c in chunks])
                row = np.concatenate([c.rows for c in chunks])
                mix.append(distinct_per_batch(shard, BATCH))
                for k in np.unique(shard)[:8]:
                    x = row[shard == k]
                    if x.size > 10:
                        rx = np.argsort(np.argsort(x))
                        rhos.append(abs(np.corrcoef(rx, np.arange(x.size))[0, 1]))
                if rank < LOCAL:
                    node.update((s.offsets[shard] + row).tolist())
            if before is not None:
                kept.append(len(node & before) / len(node))
            before = node
        out[name] = {
            "distinct_shards_per_batch": float(np.mean(mix)),
            "abs_rank_correlation": float(np.mean(rhos)),
            "node_records_kept": float(np.mean(kept)),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.cache",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    p.add_argument("--rank-spec", help=argparse.SUPPRESS)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--per-shard", type=int, default=4000)
    p.add_argument("--row-group", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--s3-latency", type=float, default=30.0, help="ms to first byte")
    p.add_argument("--s3-bandwidth", type=float, default=100.0, help="MB/s a connection")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.rank_spec:
        print(json.dumps(rank_main(json.loads(args.rank_spec))))
        return
    from scripts.bench.data import make_dataset
    from scripts.bench.s3 import moto_server
    from tests.s3proxy import Shaping, counting_proxy

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    make_dataset(tmp / "data", args.shards, args.per_shard, args.row_group, tar=False)
    parquet = sorted((tmp / "data" / "parquet").glob("*.parquet"))
    shaping = Shaping(latency_ms=args.s3_latency, mbps=args.s3_bandwidth)
    from shardstream.loader import ShardIndex

    local_index = tmp / "local.index.arrow"
    ShardIndex.build(str(tmp / "data" / "parquet")).save(str(local_index))
    doc: dict[str, Any] = {"shaping": [args.s3_latency, args.s3_bandwidth]}
    base = {"limit": None, "policy": "next-use", "locality": "node", "options": None}
    doc["local"] = run_epochs({**base, "index": str(local_index), "cache": None}, 2, "local")
    with moto_server(parquet) as upstream, counting_proxy(upstream, shaping=shaping) as proxy:
        options = {"client_kwargs": {"endpoint_url": upstream}}
        index = ShardIndex.build("s3://bench/parquet", options)  # built unshaped: not timed
        s3_index = tmp / "s3.index.arrow"
        index.save(str(s3_index))
        s3 = {
            **base,
            "index": str(s3_index),
            "options": {"client_kwargs": {"endpoint_url": proxy.url}},
        }
        doc["node"] = run_epochs({**s3, "cache": str(tmp / "c1")}, args.epochs, "node")
        share = doc["node"][-1]["held"] / (WORLD // LOCAL)  # a node's share, in the cache
        half = int(share // 2)
        doc["share"] = share
        for policy in ("next-use", "lru"):
            doc[policy] = run_epochs(
                {**s3, "cache": str(tmp / f"c-{policy}"), "limit": half, "policy": policy},
                args.epochs,
                policy,
            )
        doc["global"] = run_epochs(
            {**s3, "cache": str(tmp / "c-global"), "locality": None}, 2, "global"
        )
    sizes = ShardIndex.load(str(local_index)).shard_sizes
    doc["randomness"] = randomness(np.asarray(sizes))
    if args.json:
        print(json.dumps(doc))
    else:
        report(doc, args.epochs)


def report(doc: dict[str, Any], epochs: int) -> None:
    mb = 1e6
    local = doc["local"][1]  # the second epoch: pages cached, as the cached epochs' blocks
    print(f"S3 shaped {doc['shaping'][0]:g} ms, {doc['shaping'][1]:g} MB/s; 4 ranks on 2 nodes")
    print(
        f"local disk (limit): {local['records_per_s']:,.0f} records/s a rank, "
        f"{local['cpu_us_per_record']:.2f} CPU us/record"
    )
    e0 = doc["node"][0]["fetched"]
    print("\nlocality=node, cache unbounded")
    for e, r in enumerate(doc["node"]):
        speed = r["records_per_s"] / local["records_per_s"]
        print(
            f"  epoch {e}: fetched {r['fetched'] / mb:8.1f} MB ({r['fetched'] / e0:6.1%} of "
            f"epoch 0), {r['records_per_s']:9,.0f} records/s a rank ({speed:.2f}x local), "
            f"{r['cpu_us_per_record']:.2f} CPU us/record"
        )
    share = doc["share"] * (WORLD // LOCAL)
    print(f"\ncache_limit = half a node's share ({doc['share'] / 2 / mb:.1f} MB a node)")
    for policy in ("next-use", "lru"):
        parts = ", ".join(
            f"epoch {e} {r['fetched'] / mb:.1f} MB ({r['fetched'] / share:.2f}x share)"
            for e, r in enumerate(doc[policy])
        )
        print(f"  {policy:9s}: {parts}")
    g = doc["global"]
    print(
        f"\nlocality=None, cache unbounded: epoch 0 {g[0]['fetched'] / mb:.1f} MB, epoch 1 "
        f"{g[1]['fetched'] / mb:.1f} MB ({g[1]['fetched'] / g[0]['fetched']:.0%} of epoch 0)"
    )
    print("\nrandomness (rank 0..3, epochs 0..2):")
    for name, m in doc["randomness"].items():
        print(
            f"  {name:17s}: {m['distinct_shards_per_batch']:.2f} distinct shards a batch of "
            f"{BATCH}, |rank corr| {m['abs_rank_correlation']:.3f}, node records kept from the "
            f"epoch before {m['node_records_kept']:.0%}"
        )
    del epochs


if __name__ == "__main__":
    main()
