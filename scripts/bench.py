"""Benchmark: shardstream against the limits and the peers, on the same files, in one run.

    python scripts/bench.py [--shards 16] [--records-per-shard 10000] [--rounds 3]
                            [--s3] [--peers] [--scale 10] [--budgets 16,64] [--json]
                            [--s3-latency MS --s3-bandwidth MBPS [--s3-concurrency N]]
                            [--row-group 2000] [--batch 256] [--tokens 128]
                            [--text-chars A-B] [--no-tar] [--only a,b]

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
import contextlib
import io
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
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

# the batch-mode columns (--columns)
COLUMNS = os.environ.get("BENCH_COLUMNS", "id,tokens,text").split(",")
SMALL = ["id", "text", "label"]  # small records: the record-mode limit case
# the data's shape (--batch, --tokens, --text-chars; passed to the measuring processes by
# environment variables, so each reads what the parent wrote)
BATCH = int(os.environ.get("BENCH_BATCH", 256))
TOKENS = int(os.environ.get("BENCH_TOKENS", 128))
TEXT_CHARS = os.environ.get("BENCH_TEXT_CHARS", "")  # "A-B": random texts of A..B chars


# ---------------------------------------------------------------- data ----------------
def make_dataset(root: Path, shards: int, per_shard: int, row_group: int, tar: bool = True) -> None:
    """Parquet shards in root/parquet, the same records as tar shards in root/tar."""
    (root / "parquet").mkdir(parents=True, exist_ok=True)
    (root / "tar").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in tqdm(range(shards), desc="writing shards", leave=False):
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(per_shard, TOKENS), dtype=np.int32)
        texts = _texts(ids, rng)
        flat = pa.FixedSizeListArray.from_arrays(tokens.ravel(), TOKENS)
        table = pa.table(
            {
                "id": ids,
                "tokens": flat.cast(pa.list_(pa.int32())),
                "text": pa.array(texts),
                "label": ids % 10,
            }
        )
        pq.write_table(table, root / "parquet" / f"part-{k:05d}.parquet", row_group_size=row_group)
        if not tar:
            continue
        with tarfile.open(root / "tar" / f"part-{k:05d}.tar", "w") as tf:
            for i, row, text in zip(ids, tokens, texts):
                for ext, data in (
                    ("id", str(i).encode()),
                    ("tokens", row.tobytes()),
                    ("txt", text.encode()),
                ):
                    info = tarfile.TarInfo(f"r{i:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def _texts(ids: np.ndarray, rng: np.random.Generator) -> list[str]:
    """ "document N", or (TEXT_CHARS "A-B") texts of A..B characters."""
    if not TEXT_CHARS:
        return [f"document {i}" for i in ids]
    lo, hi = (int(x) for x in TEXT_CHARS.split("-"))
    base = "the quick brown fox jumps over the lazy dog " * (hi // 44 + 1)
    return [f"{i} {base[: int(n)]}" for i, n in zip(ids, rng.integers(lo, hi + 1, ids.size))]


# ---------------------------------------------------------------- runs ----------------
# Each run yields row counts (or byte counts for the raw S3 read) as it goes.
def raw_decode(data: Path, to_pylist: bool, columns: list[str] = COLUMNS) -> Iterator[int]:
    """Batches of the Parquet shards, decoded by pyarrow; with `to_pylist`, as records,
    handed over one by one as a record-mode loader hands them (the same consumer loop)."""
    for p in sorted((data / "parquet").glob("*.parquet")):
        for batch in pq.ParquetFile(p).iter_batches(columns=columns, batch_size=BATCH):
            if to_pylist:
                for _ in batch.to_pylist():
                    yield 1
            else:
                yield batch.num_rows


def raw_tar(data: Path) -> Iterator[int]:
    for p in sorted((data / "tar").glob("*.tar")):
        with tarfile.open(p) as tf:
            for member in tf:
                f = tf.extractfile(member)
                if f is not None and member.name.endswith(".id"):
                    f.read()
                    yield 1
                elif f is not None:
                    f.read()


def raw_s3(endpoint: str) -> Iterator[int]:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    for key in sorted(fs.ls("bench/parquet")):
        yield len(fs.cat_file(key))


RESTART = -1  # a run yields this after a warm-up: measure_one starts its clocks again


def _identity(item: Any) -> Any:
    return item


def ours(
    source: str | list[str],
    batch: bool,
    workers: int,
    endpoint: str | None,
    replicas: int = 1,
    columns: list[str] = COLUMNS,
    opts: dict[str, Any] | None = None,
) -> Iterator[int]:
    """Workers 0: the dataset iterated directly. Else a DataLoader: in batch mode one that
    passes our batches through (collate_fn identity: its default_convert would walk every
    list element); in record mode one that sends lists of BATCH records from each worker
    (per-record items would pay the DataLoader's inter-process cost once per record).
    `opts`: "budget" (memory_budget, bytes), "index" (a saved index to start from),
    "pool" (the S3 client's connections), "passes" (0 workers: read that many passes of
    the same dataset object and measure the last: the steady state)."""
    from torch.utils.data import DataLoader

    from loader import StreamingDataset

    opts = opts or {}
    options: dict[str, Any] | None = None
    if endpoint:
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        if opts.get("pool"):
            options["config_kwargs"] = {"max_pool_connections": opts["pool"]}
    tar = "tar" in str(source)
    extra = {"memory_budget": opts["budget"]} if opts.get("budget") else {}
    ds = StreamingDataset(
        opts.get("index") or source,
        columns=None if tar else columns,
        batch_size=BATCH if batch else None,
        storage_options=options,
        num_replicas=replicas,
        rank=0,
        **extra,
    )
    if not workers:
        for _ in range(int(opts.get("passes", 1)) - 1):  # warm-up passes, not measured
            for _ in ds:
                pass
            yield RESTART
        for item in ds:
            yield len(item["__key__" if tar else "id"]) if batch else 1
    elif batch:
        for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=_identity):
            yield len(item["__key__" if tar else "id"])
    else:
        for records in DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list):
            yield len(records)
    _report_stats(ds)


# the mixture row: the bench's shards as 3 streams (10, 5 and 1 shards), weighted so that
# the first crosses into its second pass within the epoch and the last gives only 2% of the
# records (a few per worker): the same total records as the single source
MIX = (("a", range(0, 10), 0.70), ("b", range(10, 15), 0.28), ("c", range(15, 16), 0.02))


def ours_mixture(data: Path, workers: int) -> Iterator[int]:
    """Our batch mode over MIX, `workers` DataLoader workers (0: iterated directly)."""
    from torch.utils.data import DataLoader

    from loader import Stream, StreamingDataset

    files = sorted((data / "parquet").glob("*.parquet"))
    streams = [Stream([str(files[k]) for k in ks], weight=w, name=n) for n, ks, w in MIX]
    records = sum(pq.read_metadata(f).num_rows for f in files)
    ds = StreamingDataset(streams, epoch_size=records, columns=COLUMNS, batch_size=BATCH)
    items: Any = (
        DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=_identity)
        if workers
        else ds
    )
    for item in items:
        yield len(item["id"])
    _report_stats(ds)


def _report_stats(ds: Any) -> None:
    """Hand the dataset's stats to measure_one (this process is one measurement)."""
    _STATS.update(ds.stats())


_STATS: dict[str, Any] = {}


def raw_ranges(endpoint: str, opts: dict[str, Any]) -> Iterator[int]:
    """The S3 limit for our reads: exactly the byte ranges our loader fetches (saved by the
    parent in opts["ranges"]), by opts["concurrency"] ranged GETs in flight at all times
    (asyncio on s3fs's client, a connection each), nothing decoded."""
    import asyncio

    import s3fs
    from fsspec.asyn import sync

    ranges = json.loads(Path(opts["ranges"]).read_text())
    n = int(opts["concurrency"])
    fs = s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint},
        config_kwargs={"max_pool_connections": n},
        skip_instance_cache=True,
    )

    async def fetch_all() -> list[int]:
        gate = asyncio.Semaphore(n)

        async def one(key: str, start: int, end: int) -> int:
            bucket, path = key.split("/", 1)
            async with gate:
                resp = await fs._call_s3(
                    "get_object", Bucket=bucket, Key=path, Range=f"bytes={start}-{end - 1}"
                )
                data = await resp["Body"].read()
                return len(data)

        return list(await asyncio.gather(*(one(*r) for r in ranges)))

    yield sum(sync(fs.loop, fetch_all))


def peer_hf_s3(endpoint: str) -> Iterator[int]:
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    files = [f"s3://bench/parquet/part-{k:05d}.parquet" for k in range(_shard_count())]
    ds = load_dataset(
        "parquet",
        data_files=files,
        split="train",
        streaming=True,
        storage_options={"client_kwargs": {"endpoint_url": endpoint}},
    )
    ds = split_dataset_by_node(ds, rank=0, world_size=1).select_columns(COLUMNS)
    for batch in ds.iter(batch_size=BATCH):
        yield len(batch["id"])


def peer_webdataset_http(endpoint: str) -> Iterator[int]:
    """webdataset streaming the tar shards over HTTP (curl), as it reads remote shards."""
    import webdataset as wds

    urls = [f"{endpoint}/bench/tar/part-{k:05d}.tar" for k in range(_shard_count())]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        yield 1


def peer_webdataset_s3(data: Path, endpoint: str) -> Iterator[int]:
    """webdataset streaming the tar shards from the S3 server through curl (its way to read
    http URLs; the objects are public-read)."""
    import webdataset as wds

    urls = [f"pipe:curl -s -f {endpoint}/bench/tar/{p.name}" for p in _tars(data)]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        yield 1


def _tars(data: Path) -> list[Path]:
    return sorted((data / "tar").glob("*.tar"))


def _shard_count() -> int:
    return int(os.environ["BENCH_SHARDS"])


def raw_dataloader_ipc(data: Path, workers: int) -> Iterator[int]:
    """The limit of any loader inside DataLoader workers: ready-made batches of the same
    shape (int64 ids, a BATCH x TOKENS int32 tensor, BATCH strings) and number of records,
    sent from `workers` processes."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Ready(IterableDataset[dict[str, Any]]):
        def __init__(self, records: int) -> None:
            self.records = records

        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            share = self.records // (info.num_workers if info else 1)
            tokens = torch.randint(0, 50_000, (BATCH, TOKENS), dtype=torch.int32)
            texts = [f"document {i}" for i in range(BATCH)]
            for _ in range(share // BATCH):
                yield {"id": torch.arange(BATCH), "tokens": tokens.clone(), "text": list(texts)}

    ds = Ready(sum(pq.read_metadata(p).num_rows for p in (data / "parquet").glob("*.parquet")))
    for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=_identity):
        yield len(item["id"])


def peer_webdataset(data: Path) -> Iterator[int]:
    import webdataset as wds

    urls = [str(p) for p in sorted((data / "tar").glob("*.tar"))]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        yield 1


def peer_hf(data: Path) -> Iterator[int]:
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    files = [str(p) for p in sorted((data / "parquet").glob("*.parquet"))]
    ds = load_dataset("parquet", data_files=files, split="train", streaming=True)
    ds = split_dataset_by_node(ds, rank=0, world_size=1).select_columns(COLUMNS)
    for batch in ds.iter(batch_size=BATCH):
        yield len(batch["id"])


def peer_distributed_sampler(data: Path) -> Iterator[int]:
    """What a user writes without a streaming loader: a map-style dataset over the
    Parquet files, torch's DistributedSampler, a DataLoader."""
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    class ParquetRows(Dataset[dict[str, Any]]):
        def __init__(self, files: list[Path]) -> None:
            self.table = pa.concat_tables([pq.read_table(f, columns=COLUMNS) for f in files])

        def __len__(self) -> int:
            return self.table.num_rows

        def __getitem__(self, i: int) -> dict[str, Any]:
            row = self.table.slice(i, 1).to_pylist()[0]
            row["tokens"] = torch.tensor(row["tokens"])
            return row

    ds = ParquetRows(sorted((data / "parquet").glob("*.parquet")))
    sampler = DistributedSampler(ds, num_replicas=1, rank=0)
    for batch in DataLoader(ds, batch_size=BATCH, sampler=sampler):
        yield len(batch["id"])


# name -> (limit it is compared with, group, builder(data, endpoint) -> run)
RUNS: dict[str, tuple[str, str, Callable[[Path, str | None], Iterator[int]]]] = {
    "raw pyarrow decode": ("", "limit", lambda d, e, o: raw_decode(d, False)),
    "raw pyarrow to_pylist": ("", "limit", lambda d, e, o: raw_decode(d, True)),
    "raw tar read": ("", "limit", lambda d, e, o: raw_tar(d)),
    "torch DataLoader IPC w2": ("", "limit", lambda d, e, o: raw_dataloader_ipc(d, 2)),
    "ours batch local w0": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None),
    ),
    "ours batch local w2": (
        "torch DataLoader IPC w2",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 2, None),
    ),
    "ours mixture batch local w0, 3 streams": (
        "ours batch local w0",
        "ours",
        lambda d, e, o: ours_mixture(d, 0),
    ),
    "ours mixture batch local w2, 3 streams": (
        "ours batch local w2",
        "ours",
        lambda d, e, o: ours_mixture(d, 2),
    ),
    "ours batch local w0, rank 0 of 4": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, replicas=4),
    ),
    "ours batch local w0, second pass": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, opts={"passes": 2}),
    ),
    "ours record local w0, small records, second pass": (
        "raw pyarrow to_pylist, small records",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None, columns=SMALL, opts={"passes": 2}),
    ),
    "ours record local w0": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None),
    ),
    "ours record local w2": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 2, None),
    ),
    "ours tar record local w0": (
        "raw tar read",
        "ours",
        lambda d, e, o: ours(str(d / "tar"), False, 0, None),
    ),
    "raw s3fs read": ("", "s3", lambda d, e, o: raw_s3(str(e))),
    "ours batch s3 w0": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e),
    ),
    "ours batch s3 w2": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 2, e),
    ),
    "ours batch s3 w0, rank 0 of 4": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, replicas=4),
    ),
    "ours record s3 w0": (
        "raw pyarrow to_pylist",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", False, 0, e),
    ),
    # tar over S3, to the first record: the index scanned (a list of URLs: every byte
    # read), read from DALI .idx sidecars beside the shards, or loaded from a saved index
    "ours tar s3 w0, index scanned": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours([f"s3://bench/tar/{p.name}" for p in _tars(d)], False, 0, e),
    ),
    "ours tar s3 w0, sidecars": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours("s3://bench/tar", False, 0, e),
    ),
    "ours tar s3 w0, saved index": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours("s3://bench/tar.index.arrow", False, 0, e),
    ),
    "webdataset tar s3": ("", "s3", lambda d, e, o: peer_webdataset_s3(d, str(e))),
    "webdataset tar": ("raw tar read", "peers", lambda d, e, o: peer_webdataset(d)),
    "hf datasets streaming": ("raw pyarrow decode", "peers", lambda d, e, o: peer_hf(d)),
    "torch DistributedSampler map-style": (
        "raw pyarrow decode",
        "peers",
        lambda d, e, o: peer_distributed_sampler(d),
    ),
    "raw pyarrow to_pylist, small records": (
        "",
        "limit",
        lambda d, e, o: raw_decode(d, True, SMALL),
    ),
    "ours record local w0, small records": (
        "raw pyarrow to_pylist, small records",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None, columns=SMALL),
    ),
    "ours batch local w0, budget": (
        "raw pyarrow decode",
        "budget",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, opts=o),
    ),
    "raw ranged GETs (limit), shaped": ("", "shaped", lambda d, e, o: raw_ranges(str(e), o)),
    "ours batch s3 w0, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, opts=o),
    ),
    "ours batch s3 w0, shaped, index built": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, opts={**o, "index": None}),
    ),
    "hf datasets streaming s3, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: peer_hf_s3(str(e)),
    ),
    "webdataset http, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: peer_webdataset_http(str(e)),
    ),
}


def _preload() -> None:
    """Import what the runs use before the clock starts: import time is not read time."""
    import importlib

    for module in ("torch", "torch.utils.data", "loader", "s3fs", "webdataset", "datasets"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def measure_one(
    name: str, data: Path, endpoint: str | None, opts: dict[str, Any]
) -> dict[str, Any]:
    """Run one measurement in this process: time, items, time to first item, peak RSS and
    the process's size after imports (the baseline the growth is counted from)."""
    _preload()
    from loader.storage.retry import bytes_fetched  # this process's reads (not its workers')

    fetched0 = 0
    base = _peak_rss_kb()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    first, count = None, 0
    for n in RUNS[name][2](data, endpoint, opts):
        if n == RESTART:  # what came before was a warm-up: measure from here
            t0, cpu0, first, count = time.perf_counter(), _cpu_seconds(), None, 0
            fetched0 = bytes_fetched()
            continue
        if first is None:
            first = time.perf_counter() - t0
        count += n
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    own = _peak_rss_kb()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # DataLoader workers

    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "count": count,
        "first_s": first or 0.0,
        "peak_rss_mb": max(own, kids) / 1024,
        "base_rss_mb": base / 1024,
        "fetched": bytes_fetched() - fetched0,
        "stats": dict(_STATS),
    }


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, all its threads, and of its children
    that have ended (DataLoader workers, joined when the loader finishes)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_rss_kb() -> int:
    """This process's peak RSS in KiB: /proc's VmHWM, which is this program's own (getrusage's
    ru_maxrss also keeps the RSS of the bench process this one was forked from before its
    exec, which grows as the bench runs)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_isolated(
    name: str, data: Path, endpoint: str | None, opts: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--one", name, "--data", str(data)]
    if endpoint:
        cmd += ["--endpoint", endpoint]
    if opts:
        cmd += ["--opts", json.dumps(opts)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {name}: skipped ({tail})", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _tar_indexes(fs: Any, url: str, tars: list[Path]) -> None:
    """The tars under bench/tar/ (public-read: webdataset fetches them over plain HTTP),
    DALI .idx sidecars beside them and their saved index at bench/tar.index.arrow."""
    from loader import ShardIndex
    from loader.formats.tar_index import write_sidecars

    for p in tars:
        fs.put_file(str(p), f"bench/tar/{p.name}")
        fs.chmod(f"bench/tar/{p.name}", acl="public-read")
    options = {"client_kwargs": {"endpoint_url": url}}
    index = ShardIndex.build([f"s3://bench/tar/{p.name}" for p in tars], options)
    index.save("s3://bench/tar.index.arrow", options)
    write_sidecars(index.shards, options)


@contextmanager
def moto_server(paths: list[Path], tars: list[Path] | None = None) -> Iterator[str]:
    """A moto S3 server holding the Parquet `paths` under bench/parquet/ and the `tars`
    under bench/tar/, with DALI .idx sidecars beside them and their saved index at
    bench/tar.index.arrow (written before any measurement)."""
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
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url})
        fs.mkdir("bench")
        for p in paths:
            fs.put_file(str(p), f"bench/parquet/{p.name}")
        if tars:
            _tar_indexes(fs, url, tars)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def summarize(
    name: str, results: list[dict[str, Any]], nbytes: dict[str, int], records: int
) -> dict[str, Any]:
    best = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    kind = "tar" if "tar" in name or "webdataset" in name else "parquet"
    is_bytes = name == "raw s3fs read"
    # bytes our loader fetched in the measuring process (index included) against the
    # run's share of the shard bytes; runs with DataLoader workers fetch in the workers
    count = records if name.startswith("raw ranged GETs") else best["count"]
    # the shard bytes of the records the run yielded (all of them; 1/4 for rank 0 of 4; a
    # mixture's records come from the same shards, at the same bytes a record)
    share = nbytes[kind] * (count / records if name.startswith("ours") else 1)
    stats = best.get("stats") or {}
    fetched = 0
    if name.startswith("ours"):  # this process's reads (index included), and its workers'
        workers = stats.get("bytes_fetched", 0) if " w0" not in name else 0
        fetched = best.get("fetched", 0) + workers
    return {
        "run": name,
        "group": RUNS[name][1],
        "fetched_mb": fetched / 1e6 if fetched and kind == "parquet" else None,
        "fetched_x_share": fetched / share if fetched and kind == "parquet" else None,
        "records_per_s": None if is_bytes else count / best["seconds"],
        # CPU per record: the median over rounds (steadier than wall time on a shared machine)
        "cpu_us_per_record": None
        if is_bytes or not count
        else statistics.median(r.get("cpu_s", 0.0) / max(1, r["count"]) for r in results) * 1e6,
        "mb_per_s": share / best["seconds"] / 1e6,
        "seconds": best["seconds"],
        "first_item_s": statistics.median(r["first_s"] for r in results),
        "first_share": statistics.median(r["first_s"] / r["seconds"] for r in results),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "rss_growth_mb": max(r["peak_rss_mb"] - r.get("base_rss_mb", 0) for r in results),
        "held_mb": stats.get("peak_held_bytes", 0) / 2**20 or None,
        "stall_fraction": stats.get("stall_fraction"),
        "limit": RUNS[name][0] or None,
    }


def our_ranges(endpoint: str, columns: list[str]) -> tuple[Any, list[list[Any]]]:
    """(the index, [key, start, end] of every byte range our loader fetches reading the
    columns of the bucket's Parquet shards): the same read groups, row groups and
    coalesced column chunks as loader.formats.parquet's reads."""
    from loader import ShardIndex
    from loader.formats.parquet import ParquetFormat
    from loader.formats.parquet_meta import _FOOTERS, _column_ranges, _row_groups

    index = ShardIndex.build("s3://bench/parquet", {"client_kwargs": {"endpoint_url": endpoint}})
    fmt = ParquetFormat()
    out: list[list[Any]] = []
    for shard in index.shards:
        meta = _FOOTERS.get((shard.url, shard.bytes, shard.version))
        limit = shard.bytes - int(shard.details["footer_bytes"])
        at = 0
        for n in fmt.groups(shard):
            _, groups = _row_groups(shard, at, at + n)
            starts, ends = _column_ranges(shard.url, meta, groups, columns)
            out += [
                [shard.url.removeprefix("s3://"), a, min(b, limit)] for a, b in zip(starts, ends)
            ]
            at += n
    return index, out


def main() -> None:
    global BATCH, TOKENS, TEXT_CHARS, COLUMNS  # the data's shape, from the arguments
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--records-per-shard", type=int, default=10_000)
    p.add_argument("--row-group", type=int, default=2_000)
    p.add_argument("--batch", type=int, default=BATCH, help="records a batch (256)")
    p.add_argument("--tokens", type=int, default=TOKENS, help="int32 tokens a record (128)")
    p.add_argument("--text-chars", default=TEXT_CHARS, help='"A-B": texts of A..B characters')
    p.add_argument("--no-tar", action="store_true", help="Parquet only (no tar runs)")
    p.add_argument("--columns", default=",".join(COLUMNS), help="batch-mode columns (a,b)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--s3", action="store_true", help="also measure through a local S3 server")
    p.add_argument("--peers", action="store_true", help="also measure the peers")
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
    BATCH, TOKENS, TEXT_CHARS = args.batch, args.tokens, args.text_chars
    COLUMNS = args.columns.split(",")
    os.environ.update(BENCH_BATCH=str(BATCH), BENCH_TOKENS=str(TOKENS), BENCH_TEXT_CHARS=TEXT_CHARS)
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
        names = [n for n, (_, g, _) in RUNS.items() if g in groups and _chosen(n, args.only)]
        rows: list[dict[str, Any]] = []

        def measure(name: str, data: Path, endpoint: str | None, opts: Any = None) -> None:
            results = [run_isolated(name, data, endpoint, opts) for _ in range(args.rounds)]
            if all(results):
                rows.append(summarize(name, results, nbytes, records))  # type: ignore[arg-type]

        tars = _tars(tmp / "data")
        with moto_server(parquet, tars) if args.s3 else _nothing() as endpoint:
            for name in tqdm(names, desc="measuring", leave=False):
                measure(name, tmp / "data", endpoint or None)
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


def shaped(
    args: argparse.Namespace, tmp: Path, nbytes: dict[str, int], records: int
) -> list[dict[str, Any]]:
    """The shaped-S3 group: the bucket behind a proxy with first-byte latency and a
    per-connection rate, every run through it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from s3proxy import Shaping, counting_proxy

    parquet = sorted((tmp / "data" / "parquet").glob("*.parquet"))
    tars = sorted((tmp / "data" / "tar").glob("*.tar"))
    shaping = Shaping(latency_ms=args.s3_latency or 0.0, mbps=args.s3_bandwidth or 0.0)
    tag = f" ({shaping.latency_ms:g} ms, {shaping.mbps:g} MB/s a connection)"
    rows: list[dict[str, Any]] = []
    with moto_server(parquet, tars) as upstream, counting_proxy(upstream, shaping=shaping) as proxy:
        index, ranges = our_ranges(upstream, COLUMNS)  # built unshaped: not timed
        index_path, ranges_path = tmp / "train.index.arrow", tmp / "ranges.json"
        index.save(str(index_path))
        ranges_path.write_text(json.dumps(ranges))
        n = args.s3_concurrency
        opts = {"index": str(index_path), "ranges": str(ranges_path), "concurrency": n}
        names = [k for k, v in RUNS.items() if v[1] == "shaped" and _chosen(k, args.only)]
        for name in tqdm(names, desc="shaped S3", leave=False):
            results = [
                run_isolated(name, tmp / "data", proxy.url, opts) for _ in range(args.rounds)
            ]
            if all(results):
                row = summarize(name, results, nbytes, records)  # type: ignore[arg-type]
                if name.startswith("raw ranged GETs"):
                    row["run"] = f"raw ranged GETs, {n} in flight (limit)"
                rows.append({**row, "run": row["run"] + tag})
    limit = next((r["run"] for r in rows if r["run"].startswith("raw ranged GETs")), None)
    for r in rows:
        r["limit"] = limit if r["run"] != limit else None
    return rows


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


def _chosen(name: str, only: str) -> bool:
    """Whether --only (comma-separated parts of names; empty: all) selects this run."""
    return not only or any(part and part in name for part in only.split(","))


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


def report(rows: list[dict[str, Any]], nbytes: dict[str, int], args: argparse.Namespace) -> None:
    if args.json:
        print(
            json.dumps(
                {
                    "shards": args.shards,
                    "records_per_shard": args.records_per_shard,
                    "bytes": nbytes,
                    "runs": rows,
                },
                indent=2,
            )
        )
        return
    print(
        f"{args.shards} shards x {args.records_per_shard:,} records: "
        f"{nbytes['parquet'] / 1e6:.1f} MB Parquet, {nbytes['tar'] / 1e6:.1f} MB tar; "
        f"medians of {args.rounds} rounds"
    )
    print(
        f"{'run':<62} {'records/s':>10} {'MB/s':>6} {'cpu us':>6} {'first s':>7} {'first%':>6} "
        f"{'RSS':>5} {'+RSS':>5} {'held':>5} {'stall':>5} {'fetch':>5} {'x lim':>5} "
        f"{'cpu x':>5}  limit"
    )
    for r in rows:
        rps = f"{r['records_per_s']:,.0f}" if r["records_per_s"] else "-"
        ratio = f"{r['ratio_to_limit']:.2f}" if r["ratio_to_limit"] else "-"
        share = f"{r['fetched_x_share']:.2f}" if r["fetched_x_share"] else "-"
        held = f"{r['held_mb']:.0f}" if r.get("held_mb") else "-"
        stall = f"{r['stall_fraction']:.2f}" if r.get("stall_fraction") is not None else "-"
        cpu = f"{r['cpu_us_per_record']:.2f}" if r.get("cpu_us_per_record") else "-"
        cpu_x = f"{r['cpu_x_limit']:.2f}" if r.get("cpu_x_limit") else "-"
        print(
            f"{r['run']:<62} {rps:>10} {r['mb_per_s']:>6.1f} {cpu:>6} {r['first_item_s']:>7.3f} "
            f"{r['first_share']:>6.1%} {r['peak_rss_mb']:>5.0f} {r['rss_growth_mb']:>5.0f} "
            f"{held:>5} {stall:>5} {share:>5} {ratio:>5} {cpu_x:>5}  {r['limit'] or ''}"
        )
    print(
        "cpu us: CPU seconds per record (user + system, all threads, DataLoader workers "
        "included), median of the rounds; cpu x: that against the limit's. "
        "first%: time to the first item / the run's time. RSS: peak MB; +RSS: over the "
        "process's size after imports; held: the most MiB our reader held (decoded groups "
        "and reads under way, counted by the loader). stall: the loop's share of time "
        "waiting for data (0 workers). fetch: bytes our loader read (index included, "
        "DataLoader workers' reads too) / the Parquet bytes of the records it yielded."
    )


if __name__ == "__main__":
    main()
