"""scripts.bench.index's `estimate` section: the time to index 1,000,000 shards at R
ranks, from the measured costs of listing, scanning, gathering and assembling."""

from __future__ import annotations

import argparse
import time
from typing import Any

import pyarrow as pa

from scripts.bench.index.setup import BUCKET, s3_server


def assembly_cost(n: int) -> dict[str, float]:
    """Seconds per shard to serialize and read back a part (the all-gather's Arrow IPC;
    the keys keep their old names pickle_us / unpickle_us) and to assemble the index on
    one rank, for synthetic Parquet parts (8 row groups a shard)."""
    from shardstream.loader.formats.parquet.meta import schema_to_b64
    from shardstream.loader.index.assemble import assemble_rows, from_ipc, scanned_rows, to_ipc
    from shardstream.loader.index.build import Listing
    from shardstream.loader.storage.filesystems import FileEntry

    schema = schema_to_b64(pa.schema([("id", pa.int64()), ("tokens", pa.list_(pa.int32()))]))
    entries = [
        FileEntry(f"s3://b/p/part-{i:07d}.parquet", 10_000_000, f"e{i:032x}") for i in range(n)
    ]
    scanned = [
        {
            "num_records": 80_000,
            "details": {
                "row_group_rows": [10_000] * 8,
                "row_group_offsets": [4 + j * 1_250_000 for j in range(8)],
                "row_group_bytes": [1_250_000] * 8,
                "footer_bytes": 3000,
            },
            "schema": schema,
        }
        for _ in range(n)
    ]
    t0 = time.perf_counter()
    blob = to_ipc(scanned_rows(scanned, list(range(n))))  # what a rank's part travels as
    t1 = time.perf_counter()
    rows = from_ipc(blob)
    t2 = time.perf_counter()
    assemble_rows(Listing("parquet", entries, []), [rows], None)
    t3 = time.perf_counter()
    return {
        "pickle_us": (t1 - t0) * 1e6 / n,
        "unpickle_us": (t2 - t1) * 1e6 / n,
        "assemble_us": (t3 - t2) * 1e6 / n,
        "bytes_per_shard": len(blob) / n,
    }


def estimate(dist_rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Seconds for 1M shards: listing + scan / R + gather and assembly of all on each rank."""
    one = next(
        (
            r
            for r in dist_rows
            if r["format"] == "parquet" and r["where"] == "s3" and r["ranks"] == 1
        ),
        None,
    )
    per_shard = one["seconds"] / one["shards"] if one else 0.0043  # the 4.3 ms
    listing = list_cost()
    cost = assembly_cost(100_000)
    n = 1_000_000
    out = {"per_shard_s": per_shard, "list_page_s": listing, **cost, "at": {}}
    for r in (1, 8, 64, 512, 4096):
        # every rank pickles its own share and unpickles everyone's
        serial = (cost["pickle_us"] * n / r + (cost["unpickle_us"] + cost["assemble_us"]) * n) / 1e6
        out["at"][r] = {
            "listing_s": listing * n / 1000,
            "scan_s": per_shard * n / r,
            "gather_assemble_s": serial,
            "total_s": listing * n / 1000 + per_shard * n / r + serial,
            "gathered_mb_per_rank": cost["bytes_per_shard"] * n / 1e6,
        }
    return out


def list_cost() -> float:
    """Seconds per 1,000-key LIST page on the local moto server (10,000 keys)."""
    from shardstream.loader.storage.listing import list_files

    with s3_server() as (url, s3):
        s3.pipe({f"{BUCKET}/l/{i:06d}.parquet": b"x" for i in range(10_000)})
        t = time.perf_counter()
        list_files(f"s3://{BUCKET}/l", {"client_kwargs": {"endpoint_url": url}})
        return (time.perf_counter() - t) / 10
