"""scripts.bench's object-store rows (--stores s3,gcs,azure): the Parquet shards in a
local server of each store (moto's S3, gcp-storage-emulator, Azurite), read by plain
pyarrow through the store's own fsspec filesystem (the limit: ``ParquetFile`` over
``fs.open`` and ``iter_batches`` of the same columns) and by ours in batch mode, so that
each store's ratio to its own plain read can be set beside the others'."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from scripts.bench.data import BATCH, COLUMNS
from tests.emulators import azurite, azurite_connection_string, gcs_emulator

STORES = ("s3", "gcs", "azure")
SCHEME = {"s3": "s3", "gcs": "gs", "azure": "az"}


def store_options(kind: str, endpoint: str) -> dict[str, Any]:
    """storage_options reaching the local server of `kind` at `endpoint`."""
    if kind == "s3":
        return {"client_kwargs": {"endpoint_url": endpoint}}
    if kind == "gcs":
        return {"endpoint_url": endpoint, "token": "anon", "project": "bench"}
    return {"connection_string": azurite_connection_string(endpoint)}


def plain_fs(kind: str, endpoint: str) -> Any:
    """The store's own fsspec filesystem (s3fs, gcsfs's core one, adlfs), as a user of
    plain pyarrow would open it."""
    options = store_options(kind, endpoint)
    if kind == "s3":
        import s3fs

        return s3fs.S3FileSystem(**options, skip_instance_cache=True)
    if kind == "gcs":
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(**options, skip_instance_cache=True)
    from adlfs import AzureBlobFileSystem

    return AzureBlobFileSystem(**options, skip_instance_cache=True)


@contextmanager
def store_servers(
    kinds: list[str], parquet: list[Path], s3: str | None
) -> Iterator[dict[str, str]]:
    """{kind: endpoint} of a server per kind holding the Parquet shards under
    bench/parquet/ (S3: the moto server scripts.bench already started, `s3`)."""
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # gcsfs.GCSFileSystem
    with ExitStack() as stack:
        endpoints: dict[str, str] = {}
        for kind in kinds:
            if kind == "s3":
                if s3 is None:
                    raise SystemExit("--stores s3 needs --s3")
                endpoints[kind] = s3
                continue
            server = gcs_emulator() if kind == "gcs" else azurite()
            endpoints[kind] = stack.enter_context(server)
            fs = plain_fs(kind, endpoints[kind])
            fs.mkdir("bench")
            for p in parquet:
                fs.put_file(str(p), f"bench/parquet/{p.name}")
        yield endpoints


def raw_store(kind: str, endpoint: str) -> Iterator[int]:
    """Plain pyarrow over the store's filesystem: each shard opened, its batches decoded."""
    import pyarrow.parquet as pq

    fs = plain_fs(kind, endpoint)
    for path in sorted(fs.ls("bench/parquet")):
        with fs.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=BATCH, columns=COLUMNS):
                yield batch.num_rows


def ours_store(kind: str, endpoint: str, batch: bool = True) -> Iterator[int]:
    """Ours in batch mode over the store, 0 workers."""
    from shardstream.loader import StreamingDataset

    ds = StreamingDataset(
        f"{SCHEME[kind]}://bench/parquet",
        columns=COLUMNS,
        batch_size=BATCH if batch else None,
        storage_options=store_options(kind, endpoint),
        seed=0,
    )
    for item in ds:
        yield len(item["id"]) if batch else 1


def store_runs() -> dict[str, tuple[str, str, Any]]:
    """runs.RUNS entries: per store, its plain pyarrow read and ours."""
    runs: dict[str, tuple[str, str, Any]] = {}
    for kind in STORES:
        limit = f"raw pyarrow on {kind}"
        runs[limit] = ("", f"store {kind}", lambda d, e, o, k=kind: raw_store(k, str(e)))
        runs[f"ours batch on {kind}"] = (
            limit,
            f"store {kind}",
            lambda d, e, o, k=kind: ours_store(k, str(e)),
        )
    return runs
