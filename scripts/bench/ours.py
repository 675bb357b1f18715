"""scripts.bench's runs of our loader: StreamingDataset in batch and record mode, 0 or
more DataLoader workers, local or S3, and a mixture of the same shards as 3 streams.

Each run yields row counts as it goes (RESTART after a warm-up) and leaves the dataset's
stats in STATS for measure.measure_one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scripts.bench.data import BATCH, COLUMNS
from scripts.bench.limits import identity

RESTART = -1  # a run yields this after a warm-up: measure_one starts its clocks again


def ours(
    source: str | list[str],
    batch: bool,
    workers: int,
    endpoint: str | None,
    replicas: int = 1,
    columns: list[str] = COLUMNS,
    opts: dict[str, Any] | None = None,
) -> Iterator[int]:
    """Workers 0: the dataset iterated directly. Else a DataLoader: in batch mode one that
    passes our batches through (collate_fn identity: its default_convert would walk every
    list element); in record mode one that sends lists of BATCH records from each worker
    (per-record items would pay the DataLoader's inter-process cost once per record).
    `opts`: "budget" (memory_budget, bytes), "index" (a saved index to start from),
    "pool" (the S3 client's connections), "format" (batch_format), "passes" (0 workers:
    read that many passes of the same dataset object and measure the last: the steady
    state)."""
    from torch.utils.data import DataLoader

    from shardstream.loader import StreamingDataset

    opts = opts or {}
    options: dict[str, Any] | None = None
    if endpoint:
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        if opts.get("pool"):
            options["config_kwargs"] = {"max_pool_connections": opts["pool"]}
    tar = "tar" in str(source)
    extra: dict[str, Any] = {"memory_budget": opts["budget"]} if opts.get("budget") else {}
    if opts.get("format"):
        extra["batch_format"] = opts["format"]
    ds = StreamingDataset(
        opts.get("index") or source,
        columns=None if tar else columns,
        batch_size=BATCH if batch else None,
        storage_options=options,
        num_replicas=replicas,
        rank=0,
        **extra,
    )
    if not workers:
        for _ in range(int(opts.get("passes", 1)) - 1):  # warm-up passes, not measured
            for _ in ds:
                pass
            yield RESTART
        for item in ds:
            yield len(item["__key__" if tar else "id"]) if batch else 1
    elif batch:
        for item in DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=identity):
            yield len(item["__key__" if tar else "id"])
    else:
        for records in DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list):
            yield len(records)
    _report_stats(ds)


# the mixture row: the bench's shards as 3 streams (10, 5 and 1 shards), weighted so that
# the first crosses into its second pass within the epoch and the last gives only 2% of the
# records (a few per worker): the same total records as the single source
MIX = (("a", range(0, 10), 0.70), ("b", range(10, 15), 0.28), ("c", range(15, 16), 0.02))


def ours_mixture(data: Path, workers: int) -> Iterator[int]:
    """Our batch mode over MIX, `workers` DataLoader workers (0: iterated directly)."""
    from torch.utils.data import DataLoader

    from shardstream.loader import Stream, StreamingDataset

    files = sorted((data / "parquet").glob("*.parquet"))
    streams = [Stream([str(files[k]) for k in ks], weight=w, name=n) for n, ks, w in MIX]
    # the epoch's size by default: the streams' records, those of the single source (the
    # harness read the footers for it itself before, inside the timed run: ~2 ms of ~170)
    ds = StreamingDataset(streams, columns=COLUMNS, batch_size=BATCH)
    items: Any = (
        DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=identity) if workers else ds
    )
    for item in items:
        yield len(item["id"])
    _report_stats(ds)


def _report_stats(ds: Any) -> None:
    """Hand the dataset's stats to measure_one (this process is one measurement)."""
    STATS.update(ds.stats())


STATS: dict[str, Any] = {}
