"""scripts.bench's runs by name: each one's limit, group and how to start it (RUNS),
and the choice of runs by --only."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scripts.bench.data import SMALL, tar_shards
from scripts.bench.limits import raw_dataloader_ipc, raw_decode, raw_ranges, raw_s3, raw_tar
from scripts.bench.ours import ours, ours_mixture
from scripts.bench.peers import (
    peer_distributed_sampler,
    peer_hf,
    peer_hf_s3,
    peer_webdataset,
    peer_webdataset_http,
    peer_webdataset_s3,
)
from scripts.bench.stores import store_runs

# name -> (limit it is compared with, group, builder(data, endpoint, storage options) -> run)
RUNS: dict[str, tuple[str, str, Callable[[Path, str | None, dict[str, Any]], Iterator[int]]]] = {
    "raw pyarrow decode": ("", "limit", lambda d, e, o: raw_decode(d, False)),
    "raw pyarrow to_pylist": ("", "limit", lambda d, e, o: raw_decode(d, True)),
    "raw tar read": ("", "limit", lambda d, e, o: raw_tar(d)),
    "torch DataLoader IPC w2": ("", "limit", lambda d, e, o: raw_dataloader_ipc(d, 2)),
    "ours batch local w0": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None),
    ),
    "ours batch local w2": (
        "torch DataLoader IPC w2",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 2, None),
    ),
    "ours mixture batch local w0, 3 streams": (
        "ours batch local w0",
        "ours",
        lambda d, e, o: ours_mixture(d, 0),
    ),
    "ours mixture batch local w2, 3 streams": (
        "ours batch local w2",
        "ours",
        lambda d, e, o: ours_mixture(d, 2),
    ),
    "ours batch local w0, rank 0 of 4": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, replicas=4),
    ),
    "ours batch local w0, arrow batches": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, opts={"format": "arrow"}),
    ),
    "ours batch local w0, second pass": (
        "raw pyarrow decode",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, opts={"passes": 2}),
    ),
    "ours record local w0, small records, second pass": (
        "raw pyarrow to_pylist, small records",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None, columns=SMALL, opts={"passes": 2}),
    ),
    "ours record local w0": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None),
    ),
    "ours record local w2": (
        "raw pyarrow to_pylist",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 2, None),
    ),
    "ours tar record local w0": (
        "raw tar read",
        "ours",
        lambda d, e, o: ours(str(d / "tar"), False, 0, None),
    ),
    "raw s3fs read": ("", "s3", lambda d, e, o: raw_s3(str(e))),
    "ours batch s3 w0": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e),
    ),
    "ours batch s3 w2": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 2, e),
    ),
    "ours batch s3 w0, rank 0 of 4": (
        "raw s3fs read",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, replicas=4),
    ),
    "ours record s3 w0": (
        "raw pyarrow to_pylist",
        "s3",
        lambda d, e, o: ours("s3://bench/parquet", False, 0, e),
    ),
    # tar over S3, to the first record: the index scanned (a list of URLs: every byte
    # read), read from DALI .idx sidecars beside the shards, or loaded from a saved index
    "ours tar s3 w0, index scanned": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours([f"s3://bench/tar/{p.name}" for p in tar_shards(d)], False, 0, e),
    ),
    "ours tar s3 w0, sidecars": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours("s3://bench/tar", False, 0, e),
    ),
    "ours tar s3 w0, saved index": (
        "webdataset tar s3",
        "s3",
        lambda d, e, o: ours("s3://bench/tar.index.arrow", False, 0, e),
    ),
    "webdataset tar s3": ("", "s3", lambda d, e, o: peer_webdataset_s3(d, str(e))),
    "webdataset tar": ("raw tar read", "peers", lambda d, e, o: peer_webdataset(d)),
    "hf datasets streaming": ("raw pyarrow decode", "peers", lambda d, e, o: peer_hf(d)),
    "torch DistributedSampler map-style": (
        "raw pyarrow decode",
        "peers",
        lambda d, e, o: peer_distributed_sampler(d),
    ),
    "raw pyarrow to_pylist, small records": (
        "",
        "limit",
        lambda d, e, o: raw_decode(d, True, SMALL),
    ),
    "ours record local w0, small records": (
        "raw pyarrow to_pylist, small records",
        "ours",
        lambda d, e, o: ours(str(d / "parquet"), False, 0, None, columns=SMALL),
    ),
    "ours batch local w0, budget": (
        "raw pyarrow decode",
        "budget",
        lambda d, e, o: ours(str(d / "parquet"), True, 0, None, opts=o),
    ),
    "raw ranged GETs (limit), shaped": ("", "shaped", lambda d, e, o: raw_ranges(str(e), o)),
    "ours batch s3 w0, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, opts=o),
    ),
    "ours batch s3 w0, shaped, index built": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: ours("s3://bench/parquet", True, 0, e, opts={**o, "index": None}),
    ),
    "hf datasets streaming s3, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: peer_hf_s3(str(e)),
    ),
    "webdataset http, shaped": (
        "raw ranged GETs (limit), shaped",
        "shaped",
        lambda d, e, o: peer_webdataset_http(str(e)),
    ),
}
# per object store (--stores): the plain pyarrow read of the Parquet shards, and ours
RUNS.update(store_runs())


def chosen(name: str, only: str) -> bool:
    """Whether --only (comma-separated parts of names; empty: all) selects this run."""
    return not only or any(part and part in name for part in only.split(","))
