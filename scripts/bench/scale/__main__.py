"""Benchmark starting at scale: the columnar index, in one table.

    python -m scripts.bench.scale [--shards 1000000] [--world-size 4096] [--ranks 4]
                                  [--latency-ms 30] [--only a,b] [--json]

Each row runs in a fresh process (so a row's memory is its own): seconds and peak RSS
growth (MB, from after the imports), against the goal beside it.

  manifest     --shards shards named by a Parquet manifest with record counts, one rank of
               --world-size (no process group, shuffle off; only that rank's shards exist):
               construction to the first batch.
  torchrun     the same manifest under torchrun (--ranks ranks, gloo): building the index
               on every rank (rank 0 reads the manifest, the listing is broadcast as
               arrays), the slowest rank's seconds and the largest RSS growth.
  saved        a saved index (Arrow IPC) of --shards Parquet shards (4 row groups each,
               synthetic) loaded; scripts.bench's tar shards (16 x 10,000 samples, 480,000
               members) from a saved index, Arrow and JSON: load, and memory held until
               the shards are read.
  tar          those tar shards, from the saved index, to the first record, locally and on
               a local S3 server (moto) through tests/s3proxy.py (--latency-ms before
               each answer, 100 MB/s a connection); webdataset's first record beside them.
  list         32 Parquet shards on that shaped S3: the first batch from a list of URLs, a
               glob and a prefix, against a saved index.
  planner      `shardstream-plan --simulate-shards --shards --world-size` (the command's
               wall time, imports included) and `--rank 0` (one rank's plan only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scripts.bench import REPO
from scripts.bench.index.setup import env  # the same child environment
from scripts.bench.scale.child import LOAD, child, first, webdataset_first
from scripts.bench.scale.data import (
    BUCKET,
    manifest_dataset,
    shaped_s3,
    synthetic_parquet_index,
)
from scripts.bench.scale.table import print_table

SECTIONS = ("manifest", "torchrun", "saved", "tar", "list", "planner")


def _hwm() -> float:
    """This process's peak RSS (VmHWM) in MB, since it was last reset."""
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    return int(status.split()[0]) / 1024


def rank_job(manifest: str) -> None:
    """One rank's part under torchrun: the index built by all ranks, between barriers."""
    import torch.distributed as dist

    from shardstream.loader.index.distributed import LAST_BUILD
    from shardstream.loader.index.shared import shared_index
    from shardstream.loader.storage.retry import RetryPolicy

    dist.init_process_group("gloo")
    dist.barrier()
    p0 = int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20  # RSS now, MB
    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS from here (Linux >= 4.0)
    t0 = time.perf_counter()
    index = shared_index(manifest, None, RetryPolicy())
    mine = time.perf_counter() - t0
    mb = _hwm() - p0
    dist.barrier()
    total = time.perf_counter() - t0
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, {"seconds": mine, "mb": mb, **LAST_BUILD})
    if dist.get_rank() == 0:
        out = {
            "seconds": total,
            # after rank 0's listing (item 1's cost): the broadcast, the gather, assembling
            "shared": max(g["total"] - g["listing"] for g in got),
            "mb": max(g["mb"] for g in got),
            "mb_others": max((g["mb"] for g in got[1:]), default=0.0),
            "ranks": got,
            "shards": len(index),
        }
        print("BENCH", json.dumps(out), flush=True)
    dist.destroy_process_group()


def torchrun(ranks: int, manifest: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={ranks}", "-m", "scripts.bench.scale", "--rank-job", str(manifest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")]
    if proc.returncode or not lines:
        raise SystemExit(f"torchrun failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1][6:])
    return out


def row(
    item: str, what: str, got: float, goal: str, unit: str = "s", **more: Any
) -> dict[str, Any]:
    out = {"item": item, "what": what, "value": got, "unit": unit, "goal": goal, **more}
    print(f"  {item} | {what}: {got:.3f} {unit} (goal {goal})", file=sys.stderr, flush=True)
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from shardstream.loader.index.shard_index import ShardIndex

    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if only & {"manifest", "torchrun"}:
            manifest = manifest_dataset(tmp / "m", args.shards, args.world_size)
        if "manifest" in only:
            got = first(str(manifest), None, args.world_size)
            rows.append(
                row(
                    "1",
                    f"{args.shards:,} manifest shards, rank 0 of {args.world_size:,}: first batch",
                    got["seconds"],
                    "<= 2 s",
                )
            )
            rows.append(row("1", "  peak RSS growth", got["mb"], "<= 150 MB", "MB"))
        if "torchrun" in only:
            got = torchrun(args.ranks, manifest)
            what = f"torchrun {args.ranks} ranks (gloo), {args.shards:,} manifest shards"
            rows.append(row("2", f"{what}: index on every rank", got["seconds"], "-"))
            shared = "  of which the broadcast, the gather and assembly (after rank 0 listed)"
            rows.append(row("2", shared, got["shared"], "<= 1 s"))
            rows.append(row("2", "  peak RSS growth, rank 0 (it also lists)", got["mb"], "-", "MB"))
            rows.append(
                row("2", "  peak RSS growth, other ranks", got["mb_others"], "<= 100 MB", "MB")
            )
        if only & {"saved", "tar"}:
            from scripts.bench.data import make_dataset

            make_dataset(tmp / "b", 16, 10_000, 2_000)
            tars = sorted((tmp / "b" / "tar").glob("*.tar"))
            tar_index = ShardIndex.build([str(p) for p in tars])
            tar_index.save(str(tmp / "tar.index.arrow"))
            tar_index.save(str(tmp / "tar.index.json"))
        if "saved" in only:
            synthetic_parquet_index(args.shards).save(str(tmp / "p.index.arrow"))
            got = child(LOAD, str(tmp / "p.index.arrow"))
            rows.append(
                row(
                    "3",
                    f"saved index (Arrow) of {args.shards:,} Parquet shards: load",
                    got["seconds"],
                    "<= 1 s",
                    mb=got["mb"],
                )
            )
            members = sum(len(s.details["members"]) * 3 for s in tar_index.shards)
            for kind in ("arrow", "json"):
                got = child(LOAD, str(tmp / f"tar.index.{kind}"))
                goal = ("<= 0.1 s", "<= 20 MB") if kind == "arrow" else ("-", "-")
                rows.append(
                    row(
                        "3",
                        f"saved tar index ({kind}, {members:,} members): load",
                        got["seconds"],
                        goal[0],
                    )
                )
                rows.append(
                    row("3", "  RSS growth until the shards are read", got["mb"], goal[1], "MB")
                )
        if "tar" in only:
            wds = webdataset_first([str(p) for p in tars])
            ours = first(str(tmp / "tar.index.arrow"), None, batch=None)
            rows.append(row("4", "tar local, first record: webdataset", wds["seconds"], "-"))
            rows.append(
                row(
                    "4",
                    "tar local, first record: ours, saved index",
                    ours["seconds"],
                    f"<= {2 * wds['seconds']:.3f} s (2x)",
                    ratio=ours["seconds"] / wds["seconds"],
                )
            )
            with shaped_s3(args.latency_ms) as (url, shaped, fs):
                for p in tars:
                    fs.put_file(str(p), f"{BUCKET}/tar/{p.name}", ACL="public-read")
                opts = {"client_kwargs": {"endpoint_url": shaped}}
                ShardIndex.build(
                    [f"s3://{BUCKET}/tar/{p.name}" for p in tars],
                    {"client_kwargs": {"endpoint_url": url}},
                ).save(f"s3://{BUCKET}/tar.index.arrow", {"client_kwargs": {"endpoint_url": url}})
                wds = webdataset_first(
                    [f"pipe:curl -s -f {shaped}/{BUCKET}/tar/{p.name}" for p in tars]
                )
                ours = first(f"s3://{BUCKET}/tar.index.arrow", opts, batch=None)
                where = f"tar s3 +{args.latency_ms:.0f} ms"
                rows.append(
                    row("4", f"{where}, first record: webdataset (curl)", wds["seconds"], "-")
                )
                rows.append(
                    row(
                        "4",
                        f"{where}, first record: ours, saved index",
                        ours["seconds"],
                        f"<= {2 * wds['seconds']:.3f} s (2x)",
                        ratio=ours["seconds"] / wds["seconds"],
                    )
                )
        if "list" in only:
            (tmp / "l").mkdir()
            paths = []
            for k in range(32):
                ids = np.arange(k * 10_000, (k + 1) * 10_000, dtype=np.int64)
                pq.write_table(
                    pa.table({"id": ids, "x": ids * 0.5}),
                    tmp / "l" / f"p-{k:03d}.parquet",
                    row_group_size=2_500,
                )
                paths.append(tmp / "l" / f"p-{k:03d}.parquet")
            with shaped_s3(args.latency_ms) as (url, shaped, fs):
                for p in paths:
                    fs.put_file(str(p), f"{BUCKET}/l/{p.name}")
                urls = [f"s3://{BUCKET}/l/{p.name}" for p in paths]
                raw = {"client_kwargs": {"endpoint_url": url}}
                ShardIndex.build(urls, raw).save(f"s3://{BUCKET}/l.index.arrow", raw)
                opts = {"client_kwargs": {"endpoint_url": shaped}}
                saved = first(f"s3://{BUCKET}/l.index.arrow", opts)["seconds"]
                where = f"32 Parquet shards, s3 +{args.latency_ms:.0f} ms, first batch"
                rows.append(row("5", f"{where}: saved index", saved, "-"))
                for how, source in (
                    ("a list of URLs", urls),
                    ("a glob", f"s3://{BUCKET}/l/*.parquet"),
                    ("a prefix", f"s3://{BUCKET}/l/"),
                ):
                    got = first(source, opts)["seconds"]
                    rows.append(
                        row(
                            "5",
                            f"{where}: {how}",
                            got,
                            f"<= {2 * saved:.3f} s (2x)",
                            ratio=got / saved,
                        )
                    )
        if "planner" in only:
            base = [
                sys.executable,
                "-m",
                "shardstream.plan",
                "--simulate-shards",
                str(args.shards),
                "--world-size",
                str(args.world_size),
                "--json",
            ]
            for what, extra in (("every rank", []), ("one rank (--rank 0)", ["--rank", "0"])):
                t0 = time.perf_counter()
                subprocess.run(base + extra, check=True, capture_output=True, env=env())
                got = time.perf_counter() - t0
                rows.append(
                    row(
                        "6",
                        f"shardstream-plan {args.shards:,} x {args.world_size:,}, {what}",
                        got,
                        "<= 2 s",
                    )
                )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.scale",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    p.add_argument("--shards", type=int, default=1_000_000)
    p.add_argument("--world-size", type=int, default=4096)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rank-job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_job:
        rank_job(args.rank_job)
        return
    rows = run(args)
    if args.json:
        print(json.dumps({"rows": rows, "shards": args.shards, "world_size": args.world_size}))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
