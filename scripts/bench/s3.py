"""scripts.bench's S3 side: the local moto S3 server holding the shards (with the tar
shards' sidecars and saved index), the byte ranges our loader fetches from it, and the
shaped-S3 rows (the bucket behind tests/s3proxy.py's latency and bandwidth)."""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.bench import data
from scripts.bench.measure import run_isolated, summarize
from scripts.bench.runs import RUNS, chosen


def _tar_indexes(fs: Any, url: str, tars: list[Path]) -> None:
    """The tars under bench/tar/ (public-read: webdataset fetches them over plain HTTP),
    DALI .idx sidecars beside them and their saved index at bench/tar.index.arrow."""
    from shardstream.loader import ShardIndex
    from shardstream.loader.formats.tar.idx import write_sidecars

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


def our_ranges(endpoint: str, columns: list[str]) -> tuple[Any, list[list[Any]]]:
    """(the index, [key, start, end] of every byte range our loader fetches reading the
    columns of the bucket's Parquet shards): the same read groups, row groups and
    coalesced column chunks as loader.formats.parquet's reads."""
    from shardstream.loader import ShardIndex
    from shardstream.loader.formats.parquet.format import ParquetFormat
    from shardstream.loader.formats.parquet.meta import FOOTERS, column_ranges, row_groups

    index = ShardIndex.build("s3://bench/parquet", {"client_kwargs": {"endpoint_url": endpoint}})
    fmt = ParquetFormat()
    out: list[list[Any]] = []
    for shard in index.shards:
        meta = FOOTERS.get((shard.url, shard.bytes, shard.version))
        limit = shard.bytes - int(shard.details["footer_bytes"])
        at = 0
        for n in fmt.groups(shard):
            _, groups = row_groups(shard, at, at + n)
            starts, ends = column_ranges(shard.url, meta, groups, columns)
            out += [
                [shard.url.removeprefix("s3://"), a, min(b, limit)] for a, b in zip(starts, ends)
            ]
            at += n
    return index, out


def shaped(
    args: argparse.Namespace, tmp: Path, nbytes: dict[str, int], records: int
) -> list[dict[str, Any]]:
    """The shaped-S3 group: the bucket behind a proxy with first-byte latency and a
    per-connection rate, every run through it."""
    from tests.s3proxy import Shaping, counting_proxy

    parquet = sorted((tmp / "data" / "parquet").glob("*.parquet"))
    tars = sorted((tmp / "data" / "tar").glob("*.tar"))
    shaping = Shaping(latency_ms=args.s3_latency or 0.0, mbps=args.s3_bandwidth or 0.0)
    tag = f" ({shaping.latency_ms:g} ms, {shaping.mbps:g} MB/s a connection)"
    rows: list[dict[str, Any]] = []
    with moto_server(parquet, tars) as upstream, counting_proxy(upstream, shaping=shaping) as proxy:
        index, ranges = our_ranges(upstream, data.COLUMNS)  # built unshaped: not timed
        index_path, ranges_path = tmp / "train.index.arrow", tmp / "ranges.json"
        index.save(str(index_path))
        ranges_path.write_text(json.dumps(ranges))
        n = args.s3_concurrency
        opts = {"index": str(index_path), "ranges": str(ranges_path), "concurrency": n}
        names = [k for k, v in RUNS.items() if v[1] == "shaped" and chosen(k, args.only)]
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
