"""scripts.bench.scale's measurements in a fresh process (so a row's memory is its
own): seconds and peak RSS growth of construction to the first item, of loading a saved
index, and of webdataset's first record."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from scripts.bench.index.setup import env  # the same child environment

# run in a fresh process: prints one JSON line (seconds, peak RSS growth in MB, ...)
_PRELUDE = (
    "import json, sys, time\n"
    "import torch, torch.distributed, torch.utils.data, pyarrow.parquet, s3fs, webdataset\n"
    "import shardstream\n"
    "from shardstream.loader.index.shard_index import ShardIndex\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
    "    return int(status.split()[0]) / 1024\n"
    "open('/proc/self/clear_refs', 'w').write('5')  # the peak RSS from here (Linux >= 4.0)\n"
    "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20\n"
    "p0 = rss(); t0 = time.perf_counter()\n"
)


def child(code: str, *argv: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + code, *argv], capture_output=True, text=True, env=env()
    )
    if proc.returncode:
        raise SystemExit(f"a measurement failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


_FIRST = (
    "opts = json.loads(sys.argv[2]) or None\n"
    "ds = shardstream.StreamingDataset(json.loads(sys.argv[1]), storage_options=opts, "
    "num_replicas=int(sys.argv[3]), rank=0, shuffle=False, batch_size=json.loads(sys.argv[4]))\n"
    "built = time.perf_counter() - t0\n"
    "next(iter(ds))\n"
    "print(json.dumps({'built_s': built, 'seconds': time.perf_counter() - t0, "
    "'mb': peak() - p0}))\n"
)


def first(
    source: Any, opts: dict[str, Any] | None, ranks: int = 1, batch: int | None = 256
) -> dict[str, Any]:
    """Construction to the first item (a batch, or a record with batch None)."""
    return child(_FIRST, json.dumps(source), json.dumps(opts), str(ranks), json.dumps(batch))


def webdataset_first(urls: list[str]) -> dict[str, Any]:
    """webdataset's first record from these URLs."""
    code = (
        "d = webdataset.WebDataset(json.loads(sys.argv[1]), shardshuffle=False)\n"
        "next(iter(d))\n"
        "print(json.dumps({'seconds': time.perf_counter() - t0, 'mb': peak() - p0}))\n"
    )
    return child(code, json.dumps(urls))


# a saved index loaded (sys.argv[1]): its seconds, RSS growth and shards
LOAD = (
    "index = ShardIndex.load(sys.argv[1])\n"
    "print(json.dumps({'seconds': time.perf_counter() - t0, 'mb': peak() - p0, "
    "'shards': len(index)}))\n"
)
