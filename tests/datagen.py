"""Small deterministic datasets for the tests: record `id` = its global id in storage order."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SIZES = [23, 0, 41, 17, 35, 9]  # 125 records, one empty shard
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("value", pa.float32()),
        ("tokens", pa.list_(pa.int32())),
        ("text", pa.string()),
    ]
)


def parquet_table(first: int, n: int, payload: int = 0) -> pa.Table:
    """Rows first..first+n-1; with `payload`, a column "blob" of that many random bytes."""
    ids = np.arange(first, first + n, dtype=np.int64)
    columns = {
        "id": ids,
        "value": ids.astype(np.float32) / 2,
        "tokens": [[int(i), int(i) + 1, int(i) + 2] for i in ids],
        "text": [f"record {i}" for i in ids],
    }
    if not payload:
        return pa.table(columns, schema=SCHEMA)
    rng = np.random.default_rng(first)
    blobs = rng.integers(0, 256, size=(n, payload), dtype=np.uint8)
    columns["blob"] = [row.tobytes() for row in blobs]
    return pa.table(columns, schema=SCHEMA.append(pa.field("blob", pa.binary())))


def tar_bytes(first: int, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(first, first + n):
            for ext, data in (("cls", str(i).encode()), ("txt", f"record {i}".encode())):
                info = tarfile.TarInfo(f"sample{i:06d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_dataset(
    fs: Any,
    root: str,
    fmt: str,
    sizes: Sequence[int] = SIZES,
    row_group_size: int = 8,
    payload: int = 0,
) -> list[str]:
    """Write shards part-00000.<fmt>, ... under `root` with `fs`; returns their paths."""
    fs.makedirs(root, exist_ok=True)
    paths, first = [], 0
    for k, n in enumerate(sizes):
        path = f"{root}/part-{k:05d}.{fmt}"
        if fmt == "parquet":
            sink = io.BytesIO()
            table = parquet_table(first, n, payload)
            pq.write_table(table, sink, row_group_size=row_group_size)
            data = sink.getvalue()
        else:
            data = tar_bytes(first, n)
        fs.pipe(path, data)
        paths.append(path)
        first += n
    return paths


def record_id(record: dict[str, Any]) -> int:
    """The global id of a Parquet row or a tar sample."""
    if "id" in record:
        return int(record["id"])
    return int(record["__key__"].removeprefix("sample"))
