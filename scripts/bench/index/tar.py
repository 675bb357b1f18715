"""scripts.bench.index's tar sections: `tar` (bytes and time to index tar shards of
small and of large members: sidecars, header scan, sequential scan) and `crossover` (the
member spacing from which ranged header reads win)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from scripts.bench.index.setup import BUCKET, env, s3_server, tar_shard, write
from tests.s3proxy import Shaping, counting_proxy


def _scan_with(source: str, options: dict[str, Any] | None, mode: str) -> dict[str, float]:
    """Index in a fresh process: 'sidecar' (sidecars present), 'header' (the default
    choice), 'ranged' (always), 'sequential' (never ranged)."""
    setup = {
        "sidecar": "pass",
        "header": "kw['sidecars']=False",
        "ranged": "kw['sidecars']=False; T.LOCAL_CROSSOVER=T.REMOTE_CROSSOVER=0",
        "sequential": "kw['sidecars']=False; T.LOCAL_CROSSOVER=T.REMOTE_CROSSOVER=1<<62",
    }[mode]
    code = (
        "import json,sys,time; import shardstream.loader.formats.tar.scan as T; "
        "from shardstream.loader import ShardIndex; "
        "from shardstream.loader.storage.retry import bytes_fetched; kw={}; "
        f"{setup}; t=time.perf_counter(); "
        f"ShardIndex.build({source!r}, json.loads(sys.argv[1]), **kw); "
        "print(json.dumps([time.perf_counter()-t, bytes_fetched()]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(options)], capture_output=True, text=True, env=env()
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    secs, fetched = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": secs, "fetched": fetched}


def tar_bytes(args: argparse.Namespace) -> list[dict[str, Any]]:
    import fsspec

    from shardstream.loader import ShardIndex
    from shardstream.loader.formats.tar.idx import write_sidecars

    kinds = {
        "small members (3 KB jpg, cls, 200 B json)": (32, 1000, (3000, 8, 200)),
        "large members (1 MB jpg, cls, 200 B json)": (8, 32, (1 << 20, 8, 200)),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, s3_server() as (url, s3):
        local = fsspec.filesystem("file")
        options = {"client_kwargs": {"endpoint_url": url}}
        for j, (kind, (shards, samples, sizes)) in enumerate(kinds.items()):
            files = {f"t-{k:04d}.tar": tar_shard(k, samples, sizes) for k in range(shards)}
            nbytes = sum(len(b) for b in files.values())
            for where, source, fs, opts in (
                ("local", f"{tmp}/k{j}", local, None),
                ("s3", f"s3://{BUCKET}/k{j}", s3, options),
            ):
                write(fs, source.removeprefix("s3://"), files)
                write_sidecars(ShardIndex.build(source, opts).shards, opts)
                for mode in ("sidecar", "header", "sequential"):
                    got = [_scan_with(source, opts, mode) for _ in range(args.rounds)]
                    secs = statistics.median(g["seconds"] for g in got)
                    rows.append(
                        {
                            "shards": kind,
                            "where": where,
                            "how": mode,
                            "seconds": secs,
                            "fetched_mb": got[0]["fetched"] / 1e6,
                            "shard_mb": nbytes / 1e6,
                        }
                    )
                    tqdm.write(f"  tar {kind} {where} {mode}: {secs:.2f}s", file=sys.stderr)
    return rows


def _read_costs(fs: Any, url: str, size: int) -> tuple[float, float]:
    """(seconds a small range read takes, bytes/s of 1 MiB reads one after another)."""
    from shardstream.loader.storage.retry import RetryPolicy, read_ranges

    retry = RetryPolicy()
    small = []
    for k in range(21):
        t = time.perf_counter()
        read_ranges(fs, [url], [k * 8192], [k * 8192 + 8192], retry)
        small.append(time.perf_counter() - t)
    t = time.perf_counter()
    for at in range(0, size, 1 << 20):
        read_ranges(fs, [url], [at], [min(size, at + (1 << 20))], retry)
    return statistics.median(small), size / (time.perf_counter() - t)


def crossover(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Locally, one shard of 32 members per size, indexed both ways end to end. Everywhere,
    the two costs that decide: a small read's time and the sequential rate; ranged header
    reads win where members lie more than (time x rate) bytes apart. (moto reads a whole
    object for every range request, so its end-to-end times grow with the object, unlike
    S3's: they are left out.)"""
    import fsspec

    from shardstream.loader.storage.filesystems import filesystem

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, s3_server() as (url, s3):
        local = fsspec.filesystem("file")
        for size in [4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20]:
            name = f"c{size}.tar"
            write(local, tmp, {name: tar_shard(0, 32, (size,))})
            got = {
                mode: statistics.median(
                    _scan_with(f"{tmp}/{name}", None, mode)["seconds"] for _ in range(args.rounds)
                )
                for mode in ("sequential", "ranged")
            }
            rows.append({"kind": "end to end", "where": "local", "member_kb": size >> 10, **got})
            tqdm.write(f"  crossover {size >> 10} KiB local: {got}", file=sys.stderr)
        blob = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
        write(local, tmp, {"blob": blob})
        write(s3, f"{BUCKET}/x", {"blob": blob})
        with counting_proxy(url, shaping=Shaping(latency_ms=args.latency_ms, mbps=100)) as proxy:
            places = [
                ("local", f"{tmp}/blob", None),
                ("s3 (moto)", f"s3://{BUCKET}/x/blob", url),
                (f"s3 +{args.latency_ms:.0f} ms, 100 MB/s", f"s3://{BUCKET}/x/blob", proxy.url),
            ]
            for where, blob_url, endpoint in places:
                opts = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else None
                opts = {**opts, "skip_instance_cache": True} if opts else None
                fs, _ = filesystem(blob_url, opts)
                request, rate = _read_costs(fs, blob_url, len(blob))
                rows.append(
                    {
                        "kind": "costs",
                        "where": where,
                        "request_ms": request * 1000,
                        "mb_per_s": rate / 1e6,
                        "crossover_kb": request * rate / 1024,
                    }
                )
                tqdm.write(f"  costs {where}: {rows[-1]}", file=sys.stderr)
    return rows
