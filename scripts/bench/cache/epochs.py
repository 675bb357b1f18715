"""Cached epochs in one process: records/s of epochs the node cache serves, against the same
shards on local disk and read from S3 without a cache, in the same run.

    python -m scripts.bench.cache.epochs [--data DIR] [--rounds 2]

scripts.bench's Parquet shards (made under `--data` if missing; 16 x 10,000 records) in a moto
S3 bucket (unshaped: what is measured is our CPU, not the network), read in batch mode
(batch 1,024; `id` and `tokens`; 0 workers; shuffled, seed 1) by one process: from S3
without a cache, and from S3 with `cache_dir` (epoch 0 fills the cache), then `--epochs`
epochs each from local disk (the limit) and from the cache, alternated (an epoch is ~0.3
s: one epoch of each against the other is mostly the machine's noise); the medians.
scripts.bench.cache measures the same across 4 ranks on 2 nodes behind a shaped S3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.bench import REPO

COLUMNS = ["id", "tokens"]


def _epoch(ds: Any) -> tuple[float, float]:
    """(records/s, CPU microseconds a record) of one pass over `ds`."""
    from scripts.bench.tokens import cpu_seconds

    t0, c0, n = time.perf_counter(), cpu_seconds(), 0
    for batch in ds:
        n += len(batch["id"])
    return n / (time.perf_counter() - t0), (cpu_seconds() - c0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.cache.epochs", description=__doc__.splitlines()[0]
    )
    p.add_argument("--data", type=Path, default=REPO / ".cache" / "bench-cache-epochs")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8, help="cached epochs a round, alternated")
    args = p.parse_args()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "bench")  # the local server takes any credentials
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import torch  # noqa: F401  (imported before the measurements, as a training job has)

    from scripts.bench.data import make_dataset
    from scripts.bench.s3 import moto_server

    shards = args.data / "parquet"
    if not any(shards.glob("*.parquet")):
        make_dataset(args.data, 16, 10_000, 1_000, tar=False)
    paths = sorted(shards.glob("*.parquet"))

    from shardstream.loader import StreamingDataset

    def dataset(source: str, **kw: Any) -> Any:
        return StreamingDataset(
            source, batch_size=1024, columns=COLUMNS, shuffle=True, seed=1, **kw
        )

    with moto_server(paths) as url:
        s3 = {"storage_options": {"client_kwargs": {"endpoint_url": url}}}
        for _ in range(args.rounds):
            remote = _epoch(dataset("s3://bench/parquet/", **s3))
            with tempfile.TemporaryDirectory() as cache:
                ds = dataset("s3://bench/parquet/", cache_dir=cache, **s3)
                local = dataset(str(shards))
                fill = _epoch(ds)  # epoch 0 fills the cache
                _epoch(local)  # (its first pass opens the files: not measured)
                pairs = []
                for e in range(1, args.epochs + 1):  # alternated: the machine's drift shared
                    local.set_epoch(e)
                    ds.set_epoch(e)
                    pairs.append((_epoch(local), _epoch(ds)))
            lim = statistics.median(x[0] for x, _ in pairs)
            got = statistics.median(y[0] for _, y in pairs)
            ratio = statistics.median(y[0] / x[0] for x, y in pairs)
            lim_cpu = statistics.median(x[1] for x, _ in pairs)
            got_cpu = statistics.median(y[1] for _, y in pairs)
            print(
                f"local {lim:,.0f} records/s, {lim_cpu:.2f} CPU us/record | "
                f"S3 uncached {remote[0]:,.0f}, {remote[1]:.2f} | "
                f"cached epoch 0 {fill[0]:,.0f}, {fill[1]:.2f} | "
                f"cached epochs 1-{args.epochs} {got:,.0f} ({ratio:.2f}x local, the median "
                f"of the epochs' ratios), {got_cpu:.2f} ({got_cpu / lim_cpu:.2f}x)"
            )


if __name__ == "__main__":
    main()
