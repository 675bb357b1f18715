"""What scripts.bench.index's sections share: their Parquet and tar shards, the
environment of the processes they start, and a local moto S3 server holding the bucket."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scripts.bench import REPO
from tests.conftest import moto_server

BUCKET = "bidx"


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
