"""Benchmark the index build: ranks, latency, tar bytes, the sidecar crossover, 1M shards.

    python -m scripts.bench.index [--shards 2000] [--tar-shards 200] [--ranks 1 2 4]
                                  [--rounds 3] [--only distributed,latency,tar,crossover,estimate]
                                  [--json]

Sections (each prints a table; --json prints one document):

  distributed  build time of N Parquet shards and M tar shards, local and on a local moto
               S3 server, with R ranks under torchrun (gloo): the median over --rounds of
               the time from a barrier before to a barrier after build_distributed on the
               slowest rank, the bytes and the CPU seconds each rank used, the S3
               server's CPU seconds, and the speed-up over R = 1.
  latency      the same build (Parquet, one rank) through tests/s3proxy.py adding 30 ms
               before every answer: the added time in round trips, against the ideal
               (listing requests + N / 64), with botocore's default pool of 10 connections
               and with ours (64).
  tar          bytes and time to index tar shards of small members (webdataset-like) and of
               large ones: from DALI sidecars, by the header scan (ranged reads where the
               first members are far apart), and by the sequential scan; local and S3.
  crossover    locally, shards of 32 members of 4 KiB .. 4 MiB indexed by sequential and by
               ranged header reads; local, S3 (moto) and S3 through the proxy (30 ms, 100 MB/s
               a connection): a small read's time and the sequential rate, whose product is
               the member spacing from which ranged reads win.
  startup      scripts.bench's tar shards (16 x 10,000 samples) on S3: seconds to the index and
               to the first record from a saved index, sidecars, a manifest with counts and
               a scan of every byte; webdataset's first record (curl) beside them.
  estimate     1,000,000 shards at R ranks from the measured costs: listing (per 1,000-key
               page), scanning (per shard, at R = 1), and gathering and assembling every
               shard on every rank (measured on synthetic parts of 100,000 shards).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tqdm import tqdm

from scripts.bench.index.build import distributed, latency
from scripts.bench.index.estimate import estimate
from scripts.bench.index.startup import startup
from scripts.bench.index.table import report
from scripts.bench.index.tar import crossover, tar_bytes


def rank_run(source: str, options: dict[str, Any] | None) -> None:
    """One rank's part (run by torchrun): build, time it between barriers, gather stats."""
    import torch.distributed as dist

    from shardstream.loader.index.distributed import build_distributed
    from shardstream.loader.storage.retry import bytes_fetched

    dist.init_process_group("gloo")
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    index = build_distributed(source, options)
    mine, cpu = time.perf_counter() - t0, time.process_time() - c0
    dist.barrier()
    total = time.perf_counter() - t0
    stats: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(stats, {"seconds": mine, "cpu": cpu, "fetched": bytes_fetched()})
    if dist.get_rank() == 0:
        print("BENCH", json.dumps({"seconds": total, "ranks": stats, "shards": len(index)}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.index",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--tar-shards", type=int, default=200)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-ms", type=float, default=30)
    p.add_argument("--only", default="distributed,latency,tar,crossover,startup,estimate")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rank-run", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_run:
        rank_run(args.rank_run[0], json.loads(args.rank_run[1]))
        return
    only = set(args.only.split(","))
    doc: dict[str, Any] = {}
    steps = [s for s in ("distributed", "latency", "tar", "crossover", "startup") if s in only]
    for step in tqdm(steps, desc="scripts.bench.index", leave=False):
        doc[step] = {
            "distributed": distributed,
            "latency": latency,
            "tar": tar_bytes,
            "crossover": crossover,
            "startup": startup,
        }[step](args)
    if "estimate" in only:
        doc["estimate"] = estimate(doc.get("distributed", []), args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        report(doc)


if __name__ == "__main__":
    main()
