"""scripts.bench.index's build sections: `distributed` (the index built by R ranks
under torchrun, local and on S3) and `latency` (the round trips a build adds behind a
proxy's latency)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.bench import REPO
from scripts.bench.index.setup import (
    BUCKET,
    env,
    parquet_shard,
    s3_server,
    tar_shard,
    write,
)
from tests.s3proxy import Shaping, counting_proxy

# the entry point torchrun starts for each rank (--rank-run), as `python -m` in REPO
BENCH_INDEX = ["-m", "scripts.bench.index"]


def _server_cpu(endpoint: str | None) -> float:
    """CPU seconds the moto server on `endpoint`'s port has used so far (0 without one)."""
    if not endpoint:
        return 0.0
    port = endpoint.rsplit(":", 1)[1]
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = stat.read_bytes().split(b"\0")
            if b"moto_server" in b" ".join(args) and port.encode() in args:
                fields = (stat.parent / "stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return 0.0


def torchrun(ranks: int, source: str, options: dict[str, Any] | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={ranks}", *BENCH_INDEX, "--rank-run", source]
    cmd += [json.dumps(options)]
    endpoint = (options or {}).get("client_kwargs", {}).get("endpoint_url")
    before = _server_cpu(endpoint)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=REPO)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")]
    if proc.returncode or not lines:
        raise SystemExit(f"torchrun failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1][6:])
    out["server_cpu"] = _server_cpu(endpoint) - before  # the listing and the reads
    return out


def distributed(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    import fsspec

    with tempfile.TemporaryDirectory() as tmp, s3_server() as (url, s3):
        local = fsspec.filesystem("file")
        data = {
            "parquet": {f"p-{k:06d}.parquet": parquet_shard(k) for k in range(args.shards)},
            "tar": {
                f"t-{k:05d}.tar": tar_shard(k, 100, (3000, 8, 200)) for k in range(args.tar_shards)
            },
        }
        options = {"client_kwargs": {"endpoint_url": url}}
        for fmt, files in data.items():
            write(local, f"{tmp}/{fmt}", files)
            write(s3, f"{BUCKET}/{fmt}", files)
            nbytes = sum(len(b) for b in files.values())
            for where, source, opts in (
                ("local", f"{tmp}/{fmt}", None),
                ("s3", f"s3://{BUCKET}/{fmt}", options),
            ):
                base = None
                for r in args.ranks:
                    runs = [torchrun(r, source, opts) for _ in range(args.rounds)]
                    run = sorted(runs, key=lambda x: x["seconds"])[len(runs) // 2]
                    secs = run["seconds"]
                    base = base or secs * r  # R = 1 first
                    rows.append(
                        {
                            "format": fmt,
                            "where": where,
                            "ranks": r,
                            "shards": len(files),
                            "seconds": secs,
                            "spread": [round(x["seconds"], 3) for x in runs],
                            "speedup": base / secs,
                            "per_shard_ms": secs * 1000 / len(files),
                            "fetched_mb": [x["fetched"] / 1e6 for x in run["ranks"]],
                            "client_cpu_s": [x["cpu"] for x in run["ranks"]],
                            "server_cpu_s": run["server_cpu"],
                            "shard_mb": nbytes / 1e6,
                        }
                    )
                    tqdm.write(f"  {fmt} {where} R={r}: {secs:.2f}s", file=sys.stderr)
    return rows


def timed_build(source: str, options: dict[str, Any]) -> float:
    """A fresh process builds the index: no cached clients, footers or connections."""
    code = (
        "import json,sys,time; from shardstream.loader import ShardIndex; t=time.perf_counter(); "
        f"ShardIndex.build({source!r}, json.loads(sys.argv[1])); print(time.perf_counter()-t)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(options)],
        capture_output=True,
        text=True,
        env=env(),
        check=True,
    )
    return float(proc.stdout.strip().splitlines()[-1])


def latency(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with s3_server() as (url, s3):
        for n in (32, 256):
            write(
                s3, f"{BUCKET}/lat{n}", {f"p-{k:05d}.parquet": parquet_shard(k) for k in range(n)}
            )
            for pool in (10, 64):
                got = {}
                for ms in (0, args.latency_ms):
                    with counting_proxy(url, shaping=Shaping(latency_ms=ms)) as proxy:
                        opts = {
                            "client_kwargs": {"endpoint_url": proxy.url},
                            "config_kwargs": {"max_pool_connections": pool},
                        }
                        times = [
                            timed_build(f"s3://{BUCKET}/lat{n}", opts) for _ in range(args.rounds)
                        ]
                        got[ms] = statistics.median(times)
                        requests = len(proxy.requests) // args.rounds
                trips = (got[args.latency_ms] - got[0]) / (args.latency_ms / 1000)
                listing = requests - n
                rows.append(
                    {
                        "shards": n,
                        "pool": pool,
                        "seconds_0ms": got[0],
                        f"seconds_{args.latency_ms}ms": got[args.latency_ms],
                        "round_trips": trips,
                        "ideal_round_trips": listing + -(-n // 64),
                        "requests": requests,
                    }
                )
                tqdm.write(f"  latency n={n} pool={pool}: {trips:.1f} round trips", file=sys.stderr)
    return rows
