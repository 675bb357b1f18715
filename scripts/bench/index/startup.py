"""scripts.bench.index's `startup` section: scripts.bench's tar shards on S3, the time to
the index and to the first record by each way to start (saved index, sidecars, manifest,
scan), webdataset's first record beside them."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.bench.index.setup import BUCKET, env, s3_server


def _ready(source: Any, endpoint: str) -> dict[str, float]:
    """In a fresh process: seconds until StreamingDataset(source) is built (its index
    ready), and until its first record (one rank, record mode, as scripts.bench reads)."""
    code = (
        "import json,sys,time; import torch; from shardstream.loader import StreamingDataset; "
        "from shardstream.loader.storage.retry import bytes_fetched; "
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
    """The tar shards of scripts.bench (16 x 10,000 samples) on S3: time to the index and to
    the first record, from a saved index, DALI sidecars, a manifest with counts, and a
    scan of every shard; webdataset's first record (curl) for comparison."""
    from scripts.bench.data import make_dataset
    from shardstream.loader import ShardIndex
    from shardstream.loader.formats.tar.idx import write_sidecars

    rows = []
    with tempfile.TemporaryDirectory() as tmp, s3_server() as (url, s3):
        make_dataset(Path(tmp), 16, 10_000, 2_000)
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
            tqdm.write(f"  startup {how}: {med}", file=sys.stderr)
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
