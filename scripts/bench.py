"""Benchmark: shardstream against the limits, on the same files, in one run.

    python scripts/bench.py [--shards 8] [--records-per-shard 20000] [--rounds 3] [--json]

Generates a Parquet dataset (an int64 id, a 128-token int32 list, a short string), then
measures, as medians over --rounds:
  limits  raw pyarrow iter_batches decode of the same columns (batch-mode limit), the
          same plus to_pylist (record-mode limit), and, with --s3, a raw s3fs read of the
          same bytes from a local moto S3 server;
  ours    StreamingDataset in batch mode and record mode, local and (--s3) over S3.
Reports records/s, MB/s (of shard bytes), time to first item and the ratio to the limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from loader import StreamingDataset

COLUMNS = ["id", "tokens", "text"]


def make_dataset(root: Path, shards: int, per_shard: int, row_group: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    rng = np.random.default_rng(0)
    for k in tqdm(range(shards), desc="writing shards", leave=False):
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(per_shard, 128), dtype=np.int32)
        table = pa.table(
            {
                "id": ids,
                "tokens": pa.FixedSizeListArray.from_arrays(tokens.ravel(), 128).cast(
                    pa.list_(pa.int32())
                ),
                "text": pa.array([f"document {i}" for i in ids]),
            }
        )
        path = root / f"part-{k:05d}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(path)
    return paths


def timed(run: Callable[[], Iterator[int]]) -> dict[str, float]:
    """Consume `run()`, a stream of row counts; wall time, rows, time to first item."""
    t0 = time.perf_counter()
    first = None
    rows = 0
    for n in run():
        if first is None:
            first = time.perf_counter() - t0
        rows += n
    return {"seconds": time.perf_counter() - t0, "rows": rows, "first_s": first or 0.0}


def raw_decode(paths: list[Path], to_pylist: bool) -> Iterator[int]:
    for p in paths:
        for batch in pq.ParquetFile(p).iter_batches(columns=COLUMNS):
            if to_pylist:
                batch.to_pylist()
            yield batch.num_rows


def ours(source: str, batch_size: int | None, options: dict[str, Any]) -> Iterator[int]:
    ds = StreamingDataset(source, columns=COLUMNS, batch_size=batch_size, storage_options=options)
    if batch_size is None:
        for _ in ds:
            yield 1
    else:
        for batch in ds:
            yield len(batch["id"])


@contextmanager
def moto_server() -> Iterator[str]:
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("--s3 needs moto_server: pip install 'moto[server]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def median_of(rounds: int, run: Callable[[], Iterator[int]]) -> dict[str, float]:
    results = [timed(run) for _ in range(rounds)]
    pick = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    pick["first_s"] = statistics.median(r["first_s"] for r in results)
    return pick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records-per-shard", type=int, default=20_000)
    parser.add_argument("--row-group", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="also measure over a local S3 server")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="shardstream-bench-"))
    try:
        paths = make_dataset(tmp / "data", args.shards, args.records_per_shard, args.row_group)
        total_bytes = sum(p.stat().st_size for p in paths)
        runs: dict[str, tuple[str, Callable[[], Iterator[int]]]] = {
            "raw pyarrow decode": ("", lambda: raw_decode(paths, False)),
            "raw pyarrow to_pylist": ("", lambda: raw_decode(paths, True)),
            "ours batch, local": (
                "raw pyarrow decode",
                lambda: ours(str(tmp / "data"), args.batch_size, {}),
            ),
            "ours record, local": (
                "raw pyarrow to_pylist",
                lambda: ours(str(tmp / "data"), None, {}),
            ),
        }
        results: dict[str, dict[str, float]] = {}
        with moto_server() if args.s3 else _nothing() as endpoint:
            if endpoint:
                _add_s3_runs(runs, endpoint, paths, args.batch_size)
            for name, (_, run) in tqdm(runs.items(), desc="measuring", leave=False):
                results[name] = median_of(args.rounds, run)
        report(results, runs, total_bytes, args.json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


def _add_s3_runs(runs: dict[str, Any], endpoint: str, paths: list[Path], batch: int) -> None:
    import os

    import s3fs

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    options = {"client_kwargs": {"endpoint_url": endpoint}}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("bench")
    for p in paths:
        fs.put_file(str(p), f"bench/data/{p.name}")
    keys = [f"bench/data/{p.name}" for p in paths]

    def raw_s3() -> Iterator[int]:
        fresh = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        for key in keys:
            data = fresh.cat_file(key)
            yield len(data)

    runs["raw s3fs read (bytes)"] = ("", raw_s3)
    runs["ours batch, S3"] = (
        "raw s3fs read (bytes)",
        lambda: ours("s3://bench/data", batch, options),
    )
    runs["ours record, S3"] = ("", lambda: ours("s3://bench/data", None, options))


def report(
    results: dict[str, dict[str, float]], runs: dict[str, Any], total: int, as_json: bool
) -> None:
    rows = []
    for name, r in results.items():
        limit_name = runs[name][0]
        mbps = total / r["seconds"] / 1e6
        row = {
            "run": name,
            "records_per_s": r["rows"] / r["seconds"] if "bytes" not in name else None,
            "mb_per_s": mbps,
            "first_item_s": r["first_s"],
            "limit": limit_name or None,
            "ratio_to_limit": (results[limit_name]["seconds"] / r["seconds"])
            if limit_name
            else None,
        }
        rows.append(row)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print(f"dataset: {total / 1e6:.1f} MB of Parquet")
    print(f"{'run':<24} {'records/s':>12} {'MB/s':>8} {'first(s)':>9} {'x limit':>8}  limit")
    for row in rows:
        rps = f"{row['records_per_s']:,.0f}" if row["records_per_s"] else "-"
        ratio = f"{row['ratio_to_limit']:.2f}" if row["ratio_to_limit"] else "-"
        print(
            f"{row['run']:<24} {rps:>12} {row['mb_per_s']:>8.1f} {row['first_item_s']:>9.3f} "
            f"{ratio:>8}  {row['limit'] or ''}"
        )


if __name__ == "__main__":
    main()
