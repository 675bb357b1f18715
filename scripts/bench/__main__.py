"""Benchmark: shardstream against the limits and the peers, on the same files, in one run.

    python -m scripts.bench [--shards 16] [--records-per-shard 10000] [--rounds 3]
                            [--s3] [--peers] [--scale 10] [--budgets 16,64] [--json]
                            [--stores s3,gcs,azure]
                            [--s3-latency MS --s3-bandwidth MBPS [--s3-concurrency N]]
                            [--row-group 2000] [--batch 256] [--tokens 128]
                            [--text-chars A-B] [--no-tar] [--only a,b]

(from the repository's root; each measuring process is `python -m scripts.bench --one`)

Generates a dataset (an int64 id, a 128-token int32 list, a short string, an int64 label
per record) as Parquet shards and the same records as tar shards, then runs each
measurement in its own process (so peak RSS is its own) --rounds times and reports medians:

  limits  raw pyarrow iter_batches decode of the same columns (batch-mode limit), the same
          plus to_pylist (record-mode limit; also for the three small columns id, text,
          label), a raw tarfile read of the tar shards, torch's DataLoader moving ready-made
          batches of the same shape from 2 worker processes (the limit of any loader in
          workers), and with --s3 a raw s3fs read of the same Parquet bytes from a local
          moto S3 server;
  ours    StreamingDataset in batch and record mode, 0 and 2 DataLoader workers, local and
          (--s3) over S3 (also as rank 0 of 4), Parquet and tar; a second pass of the same
          dataset object (the steady state: the first pass not measured); --budgets
          repeats the local batch run with other memory budgets (MiB); a mixture of the
          same shards as 3 weighted streams (10, 5 and 1 shards at 0.70, 0.28, 0.02; the
          same total records), compared with the single source's batch run;
  peers   (--peers, where installed: pip install 'shardstream[bench]') webdataset's
          WebDataset on the tar shards, Hugging Face datasets streaming the Parquet shards
          with split_dataset_by_node, torch's DistributedSampler over a map-style Parquet
          dataset.
  stores  (--stores s3,gcs,azure) the Parquet shards in a local server of each store
          (moto, gcp-storage-emulator, Azurite): plain pyarrow reading them through the
          store's own fsspec filesystem (the limit), and ours in batch mode;
  shaped  (--s3-latency, --s3-bandwidth) the same bucket behind a proxy that delays each
          answer's first byte by MS and caps each connection at MBPS MB/s, as a remote
          object store would: the raw limit (exactly the byte ranges our loader fetches,
          by --s3-concurrency ranged GETs in flight), ours (from a saved index, and with
          the index built through the proxy), HF datasets streaming the Parquet shards and
          webdataset streaming the tar shards (over HTTP, with curl), all through the proxy.

Columns: records/s, MB/s (of shard bytes), CPU seconds per record (all threads and DataLoader
workers; the steadier figure on a shared machine) and its ratio to the limit's, time to first
item and its share of the run,
peak RSS and its growth over the process's size after imports, bytes fetched against the
run's share, ratio to its limit. --scale N repeats our batch-mode run on a dataset N times
larger, to show RSS stays flat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.bench import data
from scripts.bench.data import make_dataset, tar_shards
from scripts.bench.measure import measure_one, run_isolated, summarize
from scripts.bench.runs import RUNS, chosen
from scripts.bench.s3 import moto_server, shaped
from scripts.bench.stores import store_servers
from scripts.bench.table import report


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--records-per-shard", type=int, default=10_000)
    p.add_argument("--row-group", type=int, default=2_000)
    p.add_argument("--batch", type=int, default=data.BATCH, help="records a batch (256)")
    p.add_argument("--tokens", type=int, default=data.TOKENS, help="int32 tokens a record (128)")
    p.add_argument("--text-chars", default=data.TEXT_CHARS, help='"A-B": texts of A..B characters')
    p.add_argument("--no-tar", action="store_true", help="Parquet only (no tar runs)")
    p.add_argument("--columns", default=",".join(data.COLUMNS), help="batch-mode columns (a,b)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--s3", action="store_true", help="also measure through a local S3 server")
    p.add_argument("--peers", action="store_true", help="also measure the peers")
    p.add_argument(
        "--stores",
        default="",
        help="also read the Parquet shards from these stores' local servers, plain pyarrow "
        "and ours (s3,gcs,azure; s3 needs --s3)",
    )
    p.add_argument("--scale", type=int, default=0, help="also run ours on a N times larger set")
    p.add_argument("--budgets", default="", help="also run ours with these budgets (MiB, a,b)")
    p.add_argument("--s3-latency", type=float, help="shaped S3: ms before each first byte")
    p.add_argument("--s3-bandwidth", type=float, help="shaped S3: MB/s per connection")
    p.add_argument("--s3-concurrency", type=int, default=32, help="raw limit's GETs in flight")
    p.add_argument(
        "--only", default="", help="only the runs whose names contain one of these (a,b)"
    )
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--opts", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    # the local S3 server takes any credentials; these only satisfy the client
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("BENCH_SHARDS", str(args.shards))
    # the data's shape, from the arguments
    data.BATCH, data.TOKENS = args.batch, args.tokens
    data.TEXT_CHARS = args.text_chars
    data.COLUMNS = args.columns.split(",")
    os.environ.update(
        BENCH_BATCH=str(data.BATCH),
        BENCH_TOKENS=str(data.TOKENS),
        BENCH_TEXT_CHARS=data.TEXT_CHARS,
        BENCH_COLUMNS=",".join(data.COLUMNS),
    )
    if args.one:
        opts = json.loads(args.opts)
        print(json.dumps(measure_one(args.one, Path(args.data), args.endpoint, opts)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="shardstream-bench-"))
    try:
        make_dataset(
            tmp / "data", args.shards, args.records_per_shard, args.row_group, not args.no_tar
        )
        records = args.shards * args.records_per_shard
        parquet = sorted((tmp / "data" / "parquet").glob("*.parquet"))
        nbytes = {
            k: sum(f.stat().st_size for f in (tmp / "data" / k).iterdir())
            for k in ("parquet", "tar")
        }
        groups = (
            {"limit", "ours"}
            | ({"s3"} if args.s3 else set())
            | ({"peers"} if args.peers else set())
        )
        names = [n for n, (_, g, _) in RUNS.items() if g in groups and chosen(n, args.only)]
        rows: list[dict[str, Any]] = []

        def measure(name: str, root: Path, endpoint: str | None, opts: Any = None) -> None:
            results = [run_isolated(name, root, endpoint, opts) for _ in range(args.rounds)]
            if all(results):
                rows.append(summarize(name, results, nbytes, records))  # type: ignore[arg-type]

        tars = tar_shards(tmp / "data")
        with moto_server(parquet, tars) if args.s3 else _nothing() as endpoint:
            for name in tqdm(names, desc="measuring", leave=False):
                measure(name, tmp / "data", endpoint or None)
            kinds = [k for k in args.stores.split(",") if k]
            with store_servers(kinds, parquet, endpoint or None) as endpoints:
                for kind, at in endpoints.items():
                    for name in [n for n, v in RUNS.items() if v[1] == f"store {kind}"]:
                        if chosen(name, args.only):
                            measure(name, tmp / "data", at)
        for mib in [int(b) for b in args.budgets.split(",") if b]:
            measure("ours batch local w0, budget", tmp / "data", None, {"budget": mib << 20})
            rows[-1]["run"] = f"ours batch local w0, budget {mib} MiB"
        if args.s3_latency is not None or args.s3_bandwidth is not None:
            rows += shaped(args, tmp, nbytes, records)
        if args.scale:  # the batch-mode pair again, on N times the Parquet shards
            rows += scaled(args, tmp)
        by_name = {r["run"]: r for r in rows}
        for r in rows:
            # records/s against the limit's records/s; against the raw S3 read, MB/s
            limit = by_name.get(r["limit"] or "")
            key = "mb_per_s" if (r["limit"] or "").startswith("raw s3fs") else "records_per_s"
            r["ratio_to_limit"] = r[key] / limit[key] if limit and limit[key] else None
            cpu, limit_cpu = r.get("cpu_us_per_record"), (limit or {}).get("cpu_us_per_record")
            # (a raw ranged-GET limit decodes nothing: no CPU ratio against it)
            decodes = key != "mb_per_s" and not (r["limit"] or "").startswith("raw ranged GETs")
            r["cpu_x_limit"] = cpu / limit_cpu if cpu and limit_cpu and decodes else None
        report(rows, nbytes, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scaled(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Our batch-mode runs and their limits on N times the Parquet shards."""
    big = tmp / "big"
    make_dataset(big, args.shards * args.scale, args.records_per_shard, args.row_group, tar=False)
    nb = {k: sum(f.stat().st_size for f in (big / k).iterdir()) for k in ("parquet", "tar")}
    records = args.shards * args.scale * args.records_per_shard
    tag = f", {args.scale}x data"
    pairs = [("raw pyarrow decode", "ours batch local w0")]
    pairs += [("raw s3fs read", "ours batch s3 w0")] if args.s3 else []
    big_parquet = sorted((big / "parquet").glob("*.parquet"))
    rows = []
    for pair in pairs:
        s3 = "s3" in pair[0]
        with moto_server(big_parquet) if s3 else _nothing() as endpoint:
            for name in pair:
                res = [run_isolated(name, big, endpoint) for _ in range(args.rounds)]
                if all(res):
                    row = summarize(name, res, nb, records)  # type: ignore[arg-type]
                    limit = row["limit"] and row["limit"] + tag
                    rows.append({**row, "run": name + tag, "limit": limit})
    return rows


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


if __name__ == "__main__":
    main()
