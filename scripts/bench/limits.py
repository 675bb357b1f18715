"""scripts.bench's limit runs: what the same read costs without a loader (pyarrow's
decode, a raw tarfile read, a raw s3fs read, the raw ranged GETs our loader makes, torch's
DataLoader moving ready-made batches).

Each run yields row counts (or byte counts for the raw S3 reads) as it goes.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from scripts.bench.data import BATCH, COLUMNS, TOKENS


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


def identity(item: Any) -> Any:
    """A collate_fn passing batches through as they are."""
    return item


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
    for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=identity):
        yield len(item["id"])
