"""scripts.bench.scale's data: a manifest of many Parquet shards (only one rank's
exist), a synthetic saved index of as many, and a local S3 server behind a shaping
proxy."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scripts.bench.index.setup import env  # the same child environment
from tests.conftest import moto_server
from tests.s3proxy import Shaping, counting_proxy

BUCKET = "bscale"
PER_SHARD = 1000


def manifest_dataset(root: Path, shards: int, world: int) -> Path:
    """A Parquet manifest of `shards` shards of PER_SHARD records; only the shards rank 0
    of `world` reads (shuffle off) exist, as copies of one file."""
    root.mkdir(parents=True, exist_ok=True)
    ids = np.arange(PER_SHARD, dtype=np.int64)
    table = pa.table({"id": ids, "x": np.random.default_rng(0).random(PER_SHARD)})
    pq.write_table(table, root / "s0000000.parquet", row_group_size=PER_SHARD // 4)
    size = (root / "s0000000.parquet").stat().st_size
    for k in range(1, -(-shards // world) + 2):
        shutil.copyfile(root / "s0000000.parquet", root / f"s{k:07d}.parquet")
    names = pa.array([f"s{k:07d}.parquet" for k in range(shards)])
    manifest = root / "train.manifest.parquet"
    pq.write_table(
        pa.table(
            {"url": names, "size": np.full(shards, size), "records": np.full(shards, PER_SHARD)}
        ),
        manifest,
    )
    return manifest


def synthetic_parquet_index(shards: int) -> Any:
    """An index of `shards` scanned Parquet shards of 4 row groups (the layout a real
    build records), made as arrays."""
    from shardstream.loader.index.shard_index import ShardIndex
    from shardstream.loader.index.table import shard_table

    groups = 4

    def lists(values: np.ndarray, per: int) -> pa.Array:
        offsets = np.arange(0, len(values) + 1, per, dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    n = shards * groups
    layout = {
        "row_group_rows": lists(np.full(n, PER_SHARD // groups, np.int64), groups),
        "row_group_offsets": lists(
            np.tile(np.arange(groups, dtype=np.int64) * 9000 + 4, shards), groups
        ),
        "row_group_bytes": lists(np.full(n, 9000, np.int64), groups),
        "column_uncompressed_bytes": pa.ListArray.from_arrays(
            pa.array(np.arange(0, 2 * shards + 1, 2, dtype=np.int32)),
            lists(np.full(2 * n, 8000, np.int64), groups),
        ),
        "footer_bytes": pa.array(np.full(shards, 700, np.int64)),
        "schema": pa.array(np.zeros(shards, np.int32)),
    }
    urls = pa.array([f"s3://bucket/data/part-{k:07d}.parquet" for k in range(shards)])
    versions = pa.array([f'"{k:032x}"' for k in range(shards)])
    table = shard_table(urls, np.full(shards, 36_800), versions, np.full(shards, PER_SHARD), layout)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    return ShardIndex(schemas=[schema], table=table, format="parquet")


@contextmanager
def shaped_s3(latency_ms: float) -> Iterator[tuple[str, str, Any]]:
    """(moto's URL, the shaping proxy's URL, an s3fs filesystem on moto)."""
    os.environ.update({k: v for k, v in env().items() if k.startswith("AWS_")})
    import s3fs

    with moto_server() as url:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url}, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        with counting_proxy(url, shaping=Shaping(latency_ms=latency_ms, mbps=100)) as proxy:
            yield url, proxy.url, fs
