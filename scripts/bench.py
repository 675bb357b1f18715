"""Benchmark: shardstream against the limits and the peers, on the same files, in one run.

    python scripts/bench.py [--shards 16] [--records-per-shard 10000] [--rounds 3]
                            [--s3] [--peers] [--scale 10] [--json]

Generates a dataset (an int64 id, a 128-token int32 list, a short string per record) as
Parquet shards and the same records as tar shards, then runs each measurement in its own
process (so peak RSS is its own) --rounds times and reports medians:

  limits  raw pyarrow iter_batches decode of the same columns (batch-mode limit), the same
          plus to_pylist (record-mode limit), a raw tarfile read of the tar shards, torch's
          DataLoader moving ready-made batches of the same shape from 2 worker processes
          (the limit of any loader in workers), and with --s3 a raw s3fs read of the same
          Parquet bytes from a local moto S3 server;
  ours    StreamingDataset in batch and record mode, 0 and 2 DataLoader workers, local and
          (--s3) over S3 (also as rank 0 of 4), Parquet and tar;
  peers   (--peers, where installed: pip install 'shardstream[bench]') webdataset's
          WebDataset on the tar shards, Hugging Face datasets streaming the Parquet shards
          with split_dataset_by_node, torch's DistributedSampler over a map-style Parquet
          dataset.

Columns: records/s, MB/s (of shard bytes), time to first item, peak RSS, bytes fetched
against the run's share, ratio to its limit.
--scale N repeats our batch-mode run on a dataset N times larger, to show RSS stays flat.
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

COLUMNS = ["id", "tokens", "text"]
BATCH = 256
TOKENS = 128


# ---------------------------------------------------------------- data ----------------
def make_dataset(root: Path, shards: int, per_shard: int, row_group: int, tar: bool = True) -> None:
    """Parquet shards in root/parquet, the same records as tar shards in root/tar."""
    (root / "parquet").mkdir(parents=True, exist_ok=True)
    (root / "tar").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in tqdm(range(shards), desc="writing shards", leave=False):
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(per_shard, TOKENS), dtype=np.int32)
        texts = [f"document {i}" for i in ids]
        flat = pa.FixedSizeListArray.from_arrays(tokens.ravel(), TOKENS)
        table = pa.table(
            {"id": ids, "tokens": flat.cast(pa.list_(pa.int32())), "text": pa.array(texts)}
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


# ---------------------------------------------------------------- runs ----------------
# Each run yields row counts (or byte counts for the raw S3 read) as it goes.
def raw_decode(data: Path, to_pylist: bool) -> Iterator[int]:
    for p in sorted((data / "parquet").glob("*.parquet")):
        for batch in pq.ParquetFile(p).iter_batches(columns=COLUMNS, batch_size=BATCH):
            if to_pylist:
                batch.to_pylist()
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


def _identity(item: Any) -> Any:
    return item


def ours(
    source: str | list[str], batch: bool, workers: int, endpoint: str | None, replicas: int = 1
) -> Iterator[int]:
    """Workers 0: the dataset iterated directly. Else a DataLoader: in batch mode one that
    passes our batches through (collate_fn identity: its default_convert would walk every
    list element); in record mode one that sends lists of BATCH records from each worker
    (per-record items would pay the DataLoader's inter-process cost once per record)."""
    from torch.utils.data import DataLoader

    from loader import StreamingDataset

    options = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else None
    tar = "tar" in str(source)
    ds = StreamingDataset(
        source,
        columns=None if tar else COLUMNS,
        batch_size=BATCH if batch else None,
        storage_options=options,
        num_replicas=replicas,
        rank=0,
    )
    if not workers:
        for item in ds:
            yield len(item["__key__" if tar else "id"]) if batch else 1
    elif batch:
        for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=_identity):
            yield len(item["__key__" if tar else "id"])
    else:
        for records in DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list):
            yield len(records)


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


def peer_webdataset_s3(data: Path, endpoint: str) -> Iterator[int]:
    """webdataset streaming the tar shards from the S3 server through curl (its way to read
    http URLs; the objects are public-read)."""
    import webdataset as wds

    urls = [f"pipe:curl -s -f {endpoint}/bench/tar/{p.name}" for p in _tars(data)]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        yield 1


def _tars(data: Path) -> list[Path]:
    return sorted((data / "tar").glob("*.tar"))


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
    "raw pyarrow decode": ("", "limit", lambda d, e: raw_decode(d, False)),
    "raw pyarrow to_pylist": ("", "limit", lambda d, e: raw_decode(d, True)),
    "raw tar read": ("", "limit", lambda d, e: raw_tar(d)),
    "torch DataLoader IPC w2": ("", "limit", lambda d, e: raw_dataloader_ipc(d, 2)),
    "ours batch local w0": (
        "raw pyarrow decode",
        "ours",
        lambda d, e: ours(str(d / "parquet"), True, 0, None),
    ),
    "ours batch local w2": (
        "torch DataLoader IPC w2",
        "ours",
        lambda d, e: ours(str(d / "parquet"), True, 2, None),
    ),
    "ours record local w0": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e: ours(str(d / "parquet"), False, 0, None),
    ),
    "ours record local w2": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e: ours(str(d / "parquet"), False, 2, None),
    ),
    "ours tar record local w0": (
        "raw tar read",
        "ours",
        lambda d, e: ours(str(d / "tar"), False, 0, None),
    ),
    "raw s3fs read": ("", "s3", lambda d, e: raw_s3(str(e))),
    "ours batch s3 w0": (
        "raw s3fs read",
        "s3",
        lambda d, e: ours("s3://bench/parquet", True, 0, e),
    ),
    "ours batch s3 w2": (
        "raw s3fs read",
        "s3",
        lambda d, e: ours("s3://bench/parquet", True, 2, e),
    ),
    "ours batch s3 w0, rank 0 of 4": (
        "raw s3fs read",
        "s3",
        lambda d, e: ours("s3://bench/parquet", True, 0, e, replicas=4),
    ),
    "ours record s3 w0": (
        "raw pyarrow to_pylist",
        "s3",
        lambda d, e: ours("s3://bench/parquet", False, 0, e),
    ),
    # tar over S3, to the first record: the index scanned (a list of URLs: every byte
    # read), read from DALI .idx sidecars beside the shards, or loaded from a saved index
    "ours tar s3 w0, index scanned": (
        "webdataset tar s3",
        "s3",
        lambda d, e: ours([f"s3://bench/tar/{p.name}" for p in _tars(d)], False, 0, e),
    ),
    "ours tar s3 w0, sidecars": (
        "webdataset tar s3",
        "s3",
        lambda d, e: ours("s3://bench/tar", False, 0, e),
    ),
    "ours tar s3 w0, saved index": (
        "webdataset tar s3",
        "s3",
        lambda d, e: ours("s3://bench/tar.index.json", False, 0, e),
    ),
    "webdataset tar s3": ("", "s3", lambda d, e: peer_webdataset_s3(d, str(e))),
    "webdataset tar": ("raw tar read", "peers", lambda d, e: peer_webdataset(d)),
    "hf datasets streaming": ("raw pyarrow decode", "peers", lambda d, e: peer_hf(d)),
    "torch DistributedSampler map-style": (
        "raw pyarrow decode",
        "peers",
        lambda d, e: peer_distributed_sampler(d),
    ),
}


def _preload() -> None:
    """Import what the runs use before the clock starts: import time is not read time."""
    import importlib

    for module in ("torch", "torch.utils.data", "loader", "s3fs", "webdataset", "datasets"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def measure_one(name: str, data: Path, endpoint: str | None) -> dict[str, float]:
    """Run one measurement in this process: time, items, time to first item, peak RSS."""
    _preload()
    t0 = time.perf_counter()
    first, count = None, 0
    for n in RUNS[name][2](data, endpoint):
        if first is None:
            first = time.perf_counter() - t0
        count += n
    seconds = time.perf_counter() - t0
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    from loader.retry import bytes_fetched  # this process's reads (not its workers')

    return {
        "seconds": seconds,
        "count": count,
        "first_s": first or 0.0,
        "peak_rss_mb": max(own, kids) / 1024,
        "fetched": bytes_fetched(),
    }


def run_isolated(name: str, data: Path, endpoint: str | None) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--one", name, "--data", str(data)]
    if endpoint:
        cmd += ["--endpoint", endpoint]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {name}: skipped ({tail})", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tar_indexes(fs: Any, url: str, tars: list[Path]) -> None:
    from loader import ShardIndex
    from loader.formats.tar_index import write_sidecars

    for p in tars:  # readable by plain HTTP too: webdataset fetches them with curl
        fs.put_file(str(p), f"bench/tar/{p.name}", ACL="public-read")
    options = {"client_kwargs": {"endpoint_url": url}}
    index = ShardIndex.build([f"s3://bench/tar/{p.name}" for p in tars], options)
    index.save("s3://bench/tar.index.json", options)
    write_sidecars(index.shards, options)


@contextmanager
def moto_server(paths: list[Path], tars: list[Path] | None = None) -> Iterator[str]:
    """A moto S3 server holding the Parquet `paths` under bench/parquet/ and the `tars`
    under bench/tar/, with DALI .idx sidecars beside them and their saved index at
    bench/tar.index.json (written before any measurement)."""
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


def summarize(name: str, results: list[dict[str, float]], nbytes: dict[str, int]) -> dict[str, Any]:
    best = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    kind = "tar" if "tar" in name or "webdataset" in name else "parquet"
    is_bytes = name == "raw s3fs read"
    # bytes our loader fetched in the measuring process (index included) against the
    # run's share of the shard bytes; runs with DataLoader workers fetch in the workers
    share = nbytes[kind] / (4 if "of 4" in name else 1)
    fetched = best.get("fetched", 0) if name.startswith("ours") and " w0" in name else 0
    return {
        "run": name,
        "group": RUNS[name][1],
        "fetched_mb": fetched / 1e6 if fetched and kind == "parquet" else None,
        "fetched_x_share": fetched / share if fetched and kind == "parquet" else None,
        "records_per_s": None if is_bytes else best["count"] / best["seconds"],
        "mb_per_s": share / best["seconds"] / 1e6,
        "seconds": best["seconds"],
        "first_item_s": statistics.median(r["first_s"] for r in results),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "limit": RUNS[name][0] or None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--records-per-shard", type=int, default=10_000)
    p.add_argument("--row-group", type=int, default=2_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--s3", action="store_true", help="also measure through a local S3 server")
    p.add_argument("--peers", action="store_true", help="also measure the peers")
    p.add_argument("--scale", type=int, default=0, help="also run ours on a N times larger set")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = p.parse_args()
    # the local S3 server takes any credentials; these only satisfy the client
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    if args.one:
        print(json.dumps(measure_one(args.one, Path(args.data), args.endpoint)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="shardstream-bench-"))
    try:
        make_dataset(tmp / "data", args.shards, args.records_per_shard, args.row_group)
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
        names = [n for n, (_, g, _) in RUNS.items() if g in groups]
        rows: list[dict[str, Any]] = []
        tars = sorted((tmp / "data" / "tar").glob("*.tar"))
        with moto_server(parquet, tars) if args.s3 else _nothing() as endpoint:
            for name in tqdm(names, desc="measuring", leave=False):
                results = [
                    run_isolated(name, tmp / "data", endpoint or None) for _ in range(args.rounds)
                ]
                if all(results):
                    rows.append(summarize(name, results, nbytes))  # type: ignore[arg-type]
        if args.scale:  # the batch-mode pair again, on N times the Parquet shards
            big = tmp / "big"
            make_dataset(
                big, args.shards * args.scale, args.records_per_shard, args.row_group, tar=False
            )
            nb = {k: sum(f.stat().st_size for f in (big / k).iterdir()) for k in ("parquet", "tar")}
            tag = f", {args.scale}x data"
            pairs = [("raw pyarrow decode", "ours batch local w0")]
            pairs += [("raw s3fs read", "ours batch s3 w0")] if args.s3 else []
            big_parquet = sorted((big / "parquet").glob("*.parquet"))
            for pair in pairs:
                s3 = "s3" in pair[0]
                with moto_server(big_parquet) if s3 else _nothing() as endpoint:
                    for name in pair:
                        res = [run_isolated(name, big, endpoint) for _ in range(args.rounds)]
                        row = summarize(name, res, nb)  # type: ignore[arg-type]
                        limit = row["limit"] and row["limit"] + tag
                        rows.append({**row, "run": name + tag, "limit": limit})
        by_name = {r["run"]: r for r in rows}
        for r in rows:
            # records/s against the limit's records/s; against the raw S3 read, MB/s
            limit = by_name.get(r["limit"] or "")
            key = "mb_per_s" if (r["limit"] or "").startswith("raw s3fs") else "records_per_s"
            r["ratio_to_limit"] = r[key] / limit[key] if limit else None
        report(rows, nbytes, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        f"{'run':<38} {'records/s':>11} {'MB/s':>7} {'first(s)':>8} {'RSS MB':>7} "
        f"{'fetched':>7} {'x limit':>7}  limit"
    )
    for r in rows:
        rps = f"{r['records_per_s']:,.0f}" if r["records_per_s"] else "-"
        ratio = f"{r['ratio_to_limit']:.2f}" if r["ratio_to_limit"] else "-"
        share = f"{r['fetched_x_share']:.2f}" if r["fetched_x_share"] else "-"
        print(
            f"{r['run']:<38} {rps:>11} {r['mb_per_s']:>7.1f} {r['first_item_s']:>8.3f} "
            f"{r['peak_rss_mb']:>7.0f} {share:>7} {ratio:>7}  {r['limit'] or ''}"
        )
    print(
        "fetched: bytes our loader read (index included) / its share of the Parquet bytes "
        "(1/4 for rank 0 of 4); '-' where DataLoader workers did the reading"
    )


if __name__ == "__main__":
    main()
