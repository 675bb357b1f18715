"""scripts.bench's peer runs: webdataset on the tar shards (local, S3 and HTTP via
curl), Hugging Face datasets streaming the Parquet shards (local and S3), and torch's
DistributedSampler over a map-style Parquet dataset.

Each run yields row counts as it goes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from scripts.bench.data import BATCH, COLUMNS, tar_shards


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

    urls = [f"pipe:curl -s -f {endpoint}/bench/tar/{p.name}" for p in tar_shards(data)]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        yield 1


def _shard_count() -> int:
    return int(os.environ["BENCH_SHARDS"])


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
