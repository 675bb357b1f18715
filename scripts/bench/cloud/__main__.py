"""shardstream over S3 against the raw loops, in one table (see scripts/bench/cloud/__init__)::

    python -m scripts.bench.cloud [--latency-ms 30 --mbps 100] [--rounds N] [--only a,b]
                                  [--json]

Rows (--only takes their keys): raw (the raw pyarrow loop: the limit), ranges (a raw
reader keeping as many ranged GETs in flight as ours), pq (our batches from the prefix),
pq-index (from a saved index), mix (a 0.7/0.3 mixture of two copies, saved indexes), tar
and tar-index (our records from the tar shards), wds (webdataset over HTTP), ddp-raw (the
raw loop in all 4 ranks of a torchrun job at once: the limit where the ranks share the
machine), ddp and ddp-index (our batches under torchrun, 4 ranks, gloo; without and with
a saved index), ddp-wds (webdataset in all 4 ranks at once), ddp-tar (our tar records
under torchrun). Torchrun rows give the job's pace: a rank's records over the slowest
rank's pass, the last rank's first record (a step waits for every rank).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from scripts.bench.cloud import COLUMNS, RANKS
from scripts.bench.cloud.data import column_ranges, upload, write_shards
from scripts.bench.cloud.runs import BY_KEY, ROWS, Cell, Context, child_env, measure
from scripts.bench.cloud.table import markdown, raw_rows, shaping_text


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.cloud",
        description="shardstream over a local S3 server (moto) against the raw loops",
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="first-byte latency")
    parser.add_argument("--mbps", type=float, default=0.0, help="MB/s a connection (0: no cap)")
    parser.add_argument("--rounds", type=int, default=1, help="runs a cell (the median)")
    parser.add_argument("--only", default="", help=f"rows, by key: {','.join(BY_KEY)}")
    parser.add_argument("--json", action="store_true", help="print the raw rows as JSON")
    args = parser.parse_args(argv)
    only = [k for k in args.only.split(",") if k]
    unknown = [k for k in only if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown rows {unknown}: choose from {','.join(BY_KEY)}")
    args.rows = [row for row in ROWS if not only or row.key in only]
    return args


def run(args: argparse.Namespace) -> dict[tuple[str, str], Cell]:
    """Write and upload the data, then measure every chosen row in each of its columns
    through the counting proxy (one a rank for the torchrun row)."""
    from tests.conftest import moto_server
    from tests.s3proxy import Shaping, counting_proxy

    keys = {row.key for row in args.rows}
    os.environ.update({k: v for k, v in child_env().items() if k.startswith("AWS_")})
    shaping = Shaping(latency_ms=args.latency_ms, mbps=args.mbps)
    cells: dict[tuple[str, str], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cloud-") as tmp, moto_server() as upstream:
        t = time.perf_counter()
        parquet, tars = write_shards(
            Path(tmp), tar=bool(keys & {"tar", "tar-index", "wds", "ddp-wds", "ddp-tar"})
        )
        upload(upstream, parquet, tars, copy="mix" in keys)
        tqdm.write(f"data written and uploaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        with ExitStack() as stack:
            proxies = [
                stack.enter_context(counting_proxy(upstream, shaping=shaping))
                for _ in range(RANKS if any(k.startswith("ddp") for k in keys) else 1)
            ]
            ctx = Context(
                endpoints=[p.url for p in proxies],
                parquet=[p.name for p in parquet],
                ranges=[column_ranges(p, COLUMNS) for p in parquet],
                tars=[p.name for p in tars],
            )
            jobs = [(row, column) for row in args.rows for column in row.columns]
            for row, column in tqdm(jobs, desc="runs", leave=False):
                cell = measure(row, column, ctx, args.rounds, proxies[0])
                cells[(row.key, column)] = cell
                tqdm.write(_progress(cell), file=sys.stderr)
    return cells


def _progress(cell: Cell) -> str:
    if cell.error:
        return f"  {cell.row}, {cell.column}: error: {cell.error}"
    m = cell.median
    return (
        f"  {cell.row}, {cell.column}: {m['records_per_s']:,.0f} records/s, first "
        f"{m['first_s']:.3f} s, {m['requests_before_first']:.0f} requests before it"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    t = time.perf_counter()
    cells = run(args)
    import shardstream

    measured = os.path.dirname(os.path.dirname(os.path.abspath(shardstream.__file__)))
    table = markdown(cells, shaping_text(args.latency_ms, args.mbps), args.rounds, measured)
    took = f"(the whole invocation: {time.perf_counter() - t:.0f} s)"
    if args.json:
        print(table, took, sep="\n", file=sys.stderr)
        print(json.dumps(raw_rows(cells), indent=1))
    else:
        print(table, took, sep="\n")


if __name__ == "__main__":
    main()
