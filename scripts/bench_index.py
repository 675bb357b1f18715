"""Benchmark the index build: ranks, latency, tar bytes, the sidecar crossover, 1M shards.

    python scripts/bench_index.py [--shards 2000] [--tar-shards 200] [--ranks 1 2 4]
                                  [--rounds 3] [--only distributed,latency,tar,crossover,estimate]
                                  [--json]

Sections (each prints a table; --json prints one document):

  distributed  build time of N Parquet shards and M tar shards, local and on a local moto
               S3 server, with R ranks under torchrun (gloo): the median over --rounds of
               the time from a barrier before to a barrier after build_distributed on the
               slowest rank, the bytes and the CPU seconds each rank used, the S3
               server's CPU seconds, and the speed-up over R = 1.
  latency      the same build (Parquet, one rank) through scripts/s3proxy.py adding 30 ms
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
  startup      bench.py's tar shards (16 x 10,000 samples) on S3: seconds to the index and
               to the first record from a saved index, sidecars, a manifest with counts and
               a scan of every byte; webdataset's first record (curl) beside them.
  estimate     1,000,000 shards at R ranks from the measured costs: listing (per 1,000-key
               page), scanning (per shard, at R = 1), and gathering and assembling every
               shard on every rank (measured on synthetic parts of 100,000 shards).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.s3proxy import Shaping, counting_proxy  # noqa: E402
from tests.conftest import moto_server  # noqa: E402

BUCKET = "bidx"


# ------------------------------------------------------------------ data -----------------
def parquet_shard(k: int, rows: int = 100) -> bytes:
    ids = np.arange(k * rows, (k + 1) * rows, dtype=np.int64)
    table = pa.table(
        {"id": ids, "tokens": [list(range(16))] * rows, "text": [f"r{i}" for i in ids]}
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def tar_shard(k: int, samples: int, sizes: tuple[int, ...]) -> bytes:
    """`samples` samples of one member per size in `sizes` (bytes): jpg, cls, json..."""
    exts = ["jpg", "cls", "json", "txt"]
    buf = io.BytesIO()
    rng = np.random.default_rng(k)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(samples):
            for ext, n in zip(exts, sizes):
                info = tarfile.TarInfo(f"s{k:05d}{i:06d}.{ext}")
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write(fs: Any, root: str, files: dict[str, bytes]) -> None:
    fs.makedirs(root, exist_ok=True)
    fs.pipe({f"{root}/{name}": data for name, data in files.items()})


def env() -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }


@contextmanager
def s3_server() -> Iterator[tuple[str, Any]]:
    os.environ.update({k: v for k, v in env().items() if k.startswith("AWS_")})
    import s3fs

    with moto_server() as url:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url}, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        yield url, fs


# ------------------------------------------------------------ distributed ---------------
def rank_run(source: str, options: dict[str, Any] | None) -> None:
    """One rank's part (run by torchrun): build, time it between barriers, gather stats."""
    import torch.distributed as dist

    from loader.index.distributed import build_distributed
    from loader.storage.retry import bytes_fetched

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
    cmd += [f"--nproc_per_node={ranks}", __file__, "--rank-run", source, json.dumps(options)]
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
                    print(f"  {fmt} {where} R={r}: {secs:.2f}s", file=sys.stderr)
    return rows


# --------------------------------------------------------------- latency ----------------
def timed_build(source: str, options: dict[str, Any]) -> float:
    """A fresh process builds the index: no cached clients, footers or connections."""
    code = (
        "import json,sys,time; from loader import ShardIndex; t=time.perf_counter(); "
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
                print(f"  latency n={n} pool={pool}: {trips:.1f} round trips", file=sys.stderr)
    return rows


# ------------------------------------------------------------------ tar ------------------
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
        "import json,sys,time; import loader.formats.tar as T; from loader import ShardIndex; "
        "from loader.storage.retry import bytes_fetched; kw={}; "
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

    from loader import ShardIndex
    from loader.formats.tar_index import write_sidecars

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
                    print(f"  tar {kind} {where} {mode}: {secs:.2f}s", file=sys.stderr)
    return rows


# --------------------------------------------------------------- crossover --------------
def _read_costs(fs: Any, url: str, size: int) -> tuple[float, float]:
    """(seconds a small range read takes, bytes/s of 1 MiB reads one after another)."""
    from loader.storage.retry import RetryPolicy, read_ranges

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

    from loader.storage.filesystems import filesystem

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
            print(f"  crossover {size >> 10} KiB local: {got}", file=sys.stderr)
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
                print(f"  costs {where}: {rows[-1]}", file=sys.stderr)
    return rows


# ---------------------------------------------------------------- startup ---------------
def _ready(source: Any, endpoint: str) -> dict[str, float]:
    """In a fresh process: seconds until StreamingDataset(source) is built (its index
    ready), and until its first record (one rank, record mode, as bench.py reads)."""
    code = (
        "import json,sys,time; import torch; from loader import StreamingDataset; "
        "from loader.storage.retry import bytes_fetched; "
        "t=time.perf_counter(); "
        "ds=StreamingDataset(json.loads(sys.argv[1]), storage_options=json.loads(sys.argv[2])); "
        "a=time.perf_counter()-t; f=bytes_fetched(); next(iter(ds)); b=time.perf_counter()-t; "
        "print(json.dumps([a, b, f]))"
    )
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(source), json.dumps(opts)],
        capture_output=True,
        text=True,
        env=env(),
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    ready, first, fetched = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"index_s": ready, "first_s": first, "index_fetched": fetched}


def startup(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The tar shards of bench.py (16 x 10,000 samples) on S3: time to the index and to
    the first record, from a saved index, DALI sidecars, a manifest with counts, and a
    scan of every shard; webdataset's first record (curl) for comparison."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    from loader import ShardIndex
    from loader.formats.tar_index import write_sidecars

    rows = []
    with tempfile.TemporaryDirectory() as tmp, s3_server() as (url, s3):
        bench.make_dataset(Path(tmp), 16, 10_000, 2_000)
        tars = sorted((Path(tmp) / "tar").glob("*.tar"))
        for p in tars:
            s3.put_file(str(p), f"{BUCKET}/tar/{p.name}", ACL="public-read")
        opts = {"client_kwargs": {"endpoint_url": url}}
        urls = [f"s3://{BUCKET}/tar/{p.name}" for p in tars]
        index = ShardIndex.build(urls, opts)
        index.save(f"s3://{BUCKET}/tar.index.json", opts)
        write_sidecars(index.shards, opts)
        lines = [f"{p.name} {p.stat().st_size} {s.num_records}" for p, s in zip(tars, index.shards)]
        s3.pipe(f"{BUCKET}/tar/train.manifest", ("\n".join(lines) + "\n").encode())
        sources: list[tuple[str, Any]] = [
            ("saved index", f"s3://{BUCKET}/tar.index.json"),
            ("sidecars", f"s3://{BUCKET}/tar"),
            ("manifest with counts", f"s3://{BUCKET}/tar/train.manifest"),
            ("scan (a list of URLs)", urls),
        ]
        for how, source in sources:
            got = [_ready(source, url) for _ in range(args.rounds)]
            med = {k: statistics.median(g[k] for g in got) for k in got[0]}
            rows.append({"how": how, **med})
            print(f"  startup {how}: {med}", file=sys.stderr)
        firsts = []
        for _ in range(args.rounds):
            code = (
                "import time,sys; import torch; import webdataset as wds; t=time.perf_counter(); "
                "next(iter(wds.WebDataset(sys.argv[1:], shardshuffle=False, empty_check=False))); "
                "print(time.perf_counter()-t)"
            )
            wurls = [f"pipe:curl -s -f {url}/{BUCKET}/tar/{p.name}" for p in tars]
            proc = subprocess.run(
                [sys.executable, "-c", code, *wurls], capture_output=True, text=True, env=env()
            )
            firsts.append(float(proc.stdout.strip().splitlines()[-1]))
        rows.append({"how": "webdataset (curl)", "first_s": statistics.median(firsts)})
    return rows


# --------------------------------------------------------------- estimate ---------------
def assembly_cost(n: int) -> dict[str, float]:
    """Seconds per shard to pickle, unpickle (the all-gather's serialization) and assemble
    the index on one rank, for synthetic Parquet parts (8 row groups a shard)."""
    from loader.formats.parquet_meta import schema_to_b64
    from loader.index.build import Listing, assemble
    from loader.index.distributed import _pack, _unpack
    from loader.storage.filesystems import FileEntry

    schema = schema_to_b64(pa.schema([("id", pa.int64()), ("tokens", pa.list_(pa.int32()))]))
    entries = [
        FileEntry(f"s3://b/p/part-{i:07d}.parquet", 10_000_000, f"e{i:032x}") for i in range(n)
    ]
    scanned = [
        {
            "num_records": 80_000,
            "details": {
                "row_group_rows": [10_000] * 8,
                "row_group_offsets": [4 + j * 1_250_000 for j in range(8)],
                "row_group_bytes": [1_250_000] * 8,
                "footer_bytes": 3000,
            },
            "schema": schema,
        }
        for _ in range(n)
    ]
    t0 = time.perf_counter()
    blob = pickle.dumps(_pack(scanned))
    t1 = time.perf_counter()
    rows = _unpack(pickle.loads(blob))
    t2 = time.perf_counter()
    assemble(Listing("parquet", entries, []), rows, None)
    t3 = time.perf_counter()
    return {
        "pickle_us": (t1 - t0) * 1e6 / n,
        "unpickle_us": (t2 - t1) * 1e6 / n,
        "assemble_us": (t3 - t2) * 1e6 / n,
        "bytes_per_shard": len(blob) / n,
    }


def estimate(dist_rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Seconds for 1M shards: listing + scan / R + gather and assembly of all on each rank."""
    one = next(
        (
            r
            for r in dist_rows
            if r["format"] == "parquet" and r["where"] == "s3" and r["ranks"] == 1
        ),
        None,
    )
    per_shard = one["seconds"] / one["shards"] if one else 0.0043  # the 4.3 ms
    listing = list_cost()
    cost = assembly_cost(100_000)
    n = 1_000_000
    out = {"per_shard_s": per_shard, "list_page_s": listing, **cost, "at": {}}
    for r in (1, 8, 64, 512, 4096):
        # every rank pickles its own share and unpickles everyone's
        serial = (cost["pickle_us"] * n / r + (cost["unpickle_us"] + cost["assemble_us"]) * n) / 1e6
        out["at"][r] = {
            "listing_s": listing * n / 1000,
            "scan_s": per_shard * n / r,
            "gather_assemble_s": serial,
            "total_s": listing * n / 1000 + per_shard * n / r + serial,
            "gathered_mb_per_rank": cost["bytes_per_shard"] * n / 1e6,
        }
    return out


def list_cost() -> float:
    """Seconds per 1,000-key LIST page on the local moto server (10,000 keys)."""
    from loader.storage.filesystems import list_files

    with s3_server() as (url, s3):
        s3.pipe({f"{BUCKET}/l/{i:06d}.parquet": b"x" for i in range(10_000)})
        t = time.perf_counter()
        list_files(f"s3://{BUCKET}/l", {"client_kwargs": {"endpoint_url": url}})
        return (time.perf_counter() - t) / 10


# ------------------------------------------------------------------ main -----------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
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
    for step in tqdm(steps, desc="bench_index", leave=False):
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


def report(doc: dict[str, Any]) -> None:
    for r in doc.get("distributed", []):
        fetched = "/".join(f"{x:.1f}" for x in r["fetched_mb"])
        cpu = "/".join(f"{x:.2f}" for x in r["client_cpu_s"])
        print(
            f"{r['format']:<8} {r['where']:<6} R={r['ranks']}  {r['shards']:>5} shards  "
            f"{r['seconds']:6.2f}s  x{r['speedup']:.2f}  {r['per_shard_ms']:.2f} ms/shard  "
            f"fetched MB per rank {fetched} (shards {r['shard_mb']:.0f} MB); CPU s per rank "
            f"{cpu}, server {r['server_cpu_s']:.2f}"
        )
    for r in doc.get("latency", []):
        print(
            f"latency: {r['shards']} shards, pool {r['pool']}: {r['round_trips']:.1f} round trips "
            f"(ideal {r['ideal_round_trips']}), {r['requests']} requests"
        )
    for r in doc.get("tar", []):
        print(
            f"tar {r['shards']:<44} {r['where']:<6} {r['how']:<10} {r['seconds']:6.2f}s "
            f"{r['fetched_mb']:9.2f} MB of {r['shard_mb']:.0f} MB"
        )
    for r in doc.get("crossover", []):
        if r["kind"] == "costs":
            print(
                f"read costs {r['where']:<22} small read {r['request_ms']:.2f} ms, sequential "
                f"{r['mb_per_s']:.0f} MB/s: ranged reads win past ~{r['crossover_kb']:.0f} KiB"
            )
        else:
            print(
                f"end to end {r['where']}, {r['member_kb']:>5} KiB members: sequential "
                f"{r['sequential']:.4f}s, ranged {r['ranged']:.4f}s"
            )
    for r in doc.get("startup", []):
        index = f"index {r['index_s']:.3f}s, " if "index_s" in r else ""
        print(f"startup {r['how']:<24} {index}first record {r['first_s']:.3f}s")
    est = doc.get("estimate")
    if est:
        print(
            f"estimate: {est['per_shard_s'] * 1000:.2f} ms/shard scanned, "
            f"{est['list_page_s']:.3f} s per LIST page, "
            f"{est['bytes_per_shard']:.0f} B/shard gathered, "
            f"{est['unpickle_us'] + est['assemble_us']:.1f} us/shard to unpickle and assemble"
        )
        for r, e in est["at"].items():
            print(
                f"  1,000,000 shards, R={r}: {e['total_s']:.0f}s (listing {e['listing_s']:.0f}, "
                f"scan {e['scan_s']:.1f}, gather+assemble {e['gather_assemble_s']:.1f}; "
                f"{e['gathered_mb_per_rank']:.0f} MB gathered per rank)"
            )


if __name__ == "__main__":
    main()
