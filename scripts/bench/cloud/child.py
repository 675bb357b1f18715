"""scripts.bench.cloud's measured runs, each in a process of its own::

    python -m scripts.bench.cloud.child SPEC_JSON

(and under torchrun, ``-m scripts.bench.cloud.child`` with a "ddp" spec). `import torch,
shardstream` happen first; then the clock starts (time.monotonic(), which is system-wide
on Linux, so the parent compares it with the proxy's timeline), the run makes its own S3
client and reads one full pass over the rank's records, and the process prints one line,
``CLOUD {json}``: the clock's start, the first record's arrival and the end (monotonic),
the records and the CPU seconds of the pass (time.process_time: all threads).

Only the public API of shardstream is used (StreamingDataset, Stream, ds.stats()), so an
older checkout runs it too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

PREFIX = "CLOUD "  # the result line's prefix (library logs may share stdout)


def _options(endpoint: str) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": endpoint}}


def _rows(batch: Any) -> int:
    """The records in a batch: a dict of columns (its first column's length) or a
    table-like object (its length)."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch)


def raw_loop(spec: dict[str, Any]) -> Iterator[int]:
    """The limit: each of the rank's shards in order, pyarrow's batches over an s3fs file."""
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(**_options(spec["endpoint"]))
    for key in spec["keys"]:
        with fs.open(key, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(
                batch_size=spec["batch_size"], columns=spec["columns"]
            ):
                yield batch.num_rows


def raw_ranges(spec: dict[str, Any]) -> Iterator[int]:
    """The rank's Parquet files fetched as fs.cat_ranges fetches them (s3fs's _cat_file
    per range), the column-chunk ranges of every file and its footer, `concurrency`
    requests in flight over all files in order; each file decoded (pyarrow's batches) as
    soon as its ranges are in."""
    import asyncio
    import queue

    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    n = int(spec["concurrency"])
    fs = s3fs.S3FileSystem(config_kwargs={"max_pool_connections": n}, **_options(spec["endpoint"]))
    files = spec["files"]
    done: queue.Queue[tuple[bytes, None] | tuple[None, BaseException]] = queue.Queue()

    async def fetch_all() -> None:
        gate = asyncio.Semaphore(n)  # FIFO: the files' ranges go out in order

        async def one(key: str, start: int, end: int) -> bytes:
            async with gate:
                data: bytes = await fs._cat_file(key, start=start, end=end)
                return data

        try:
            tasks = [
                [asyncio.ensure_future(one(f["key"], a, b)) for a, b in f["ranges"]] for f in files
            ]
            for f, parts in zip(files, tasks):
                buf = bytearray(f["size"])  # the bytes not fetched stay zeros: never read
                for (a, b), got in zip(f["ranges"], await asyncio.gather(*parts)):
                    buf[a:b] = got
                done.put((bytes(buf), None))
        except BaseException as e:  # handed to the reading thread
            done.put((None, e))

    asyncio.run_coroutine_threadsafe(fetch_all(), fs.loop)
    for _ in files:
        buf, error = done.get()
        if error is not None:
            raise error
        reader = pq.ParquetFile(pa.BufferReader(buf))
        for batch in reader.iter_batches(batch_size=spec["batch_size"], columns=spec["columns"]):
            yield batch.num_rows


def ours(spec: dict[str, Any], holder: list[Any]) -> Iterator[int]:
    """shardstream's StreamingDataset (one source or a mixture of Streams), one pass."""
    import shardstream

    kwargs: dict[str, Any] = {"storage_options": _options(spec["endpoint"])}
    if spec.get("batch_size"):
        kwargs["batch_size"] = spec["batch_size"]
    if spec.get("columns"):
        kwargs["columns"] = spec["columns"]
    if spec.get("num_replicas"):
        kwargs.update(num_replicas=spec["num_replicas"], rank=spec["rank"])
    source: Any = spec.get("source")
    if spec.get("streams"):
        source = [
            shardstream.Stream(src, weight=weight, name=name)
            for src, weight, name in spec["streams"]
        ]
        kwargs["epoch_size"] = spec["epoch_size"]
    ds = shardstream.StreamingDataset(source, **kwargs)
    holder.append(ds)
    batched = bool(spec.get("batch_size"))
    for item in ds:
        yield _rows(item) if batched else 1


def webdataset_run(spec: dict[str, Any]) -> Iterator[int]:
    """webdataset over the tars' plain HTTP URLs (it reads them with curl), one record at
    a time, as it streams remote shards."""
    import webdataset as wds

    # (the URLs are this rank's already: under torchrun no node splitting on top, which
    # webdataset's nodesplitter=None leaves out)
    urls = spec["urls"]
    for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False, nodesplitter=None):
        yield 1


def _stats(holder: list[Any]) -> Any:
    """ds.stats() where the checkout has it, made JSON-safe (None otherwise)."""
    try:
        got = holder[0].stats() if holder else None
        text = json.dumps(got, default=str)
        return json.loads(text) if len(text) < 20_000 else None
    except Exception:
        return None


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One full pass of the spec's run, from the clock's start (before any S3 client or
    dataset exists) to its last record."""
    holder: list[Any] = []
    cpu0, t0 = time.process_time(), time.monotonic()
    kind = spec["kind"]
    if kind == "raw_loop":
        items = raw_loop(spec)
    elif kind == "raw_ranges":
        items = raw_ranges(spec)
    elif kind == "wds":
        items = webdataset_run(spec)
    else:
        items = ours(spec, holder)
    first, count = None, 0
    for n in items:
        if first is None:
            first = time.monotonic()
        count += n
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    return {
        "t0": t0,
        "first": first if first is not None else end,
        "end": end,
        "count": count,
        "cpu_s": cpu,
        "stats": _stats(holder),
    }


def ddp(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Under torchrun: the process group first (gloo), then each rank builds its dataset
    from the prefix (num_replicas and rank from the group), through its own proxy; rank
    0's figures, with the slowest rank's first record and pass (``"slowest"``). With
    ``"each"`` (a spec a rank, e.g. the raw loop over the rank's keys), each rank runs its
    own instead: a limit or peer with every rank sharing the machine, as ours do."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mine = {**spec, "kind": "ours", "endpoint": spec["endpoints"][rank]}
    if "each" in spec:
        mine.update(spec["each"][rank])
    mine.pop("num_replicas", None)
    result = measure(mine)
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, result)
    dist.destroy_process_group()
    if rank:
        return None
    # the job's pace: a training step waits for every rank, so its first waits for the
    # last rank's first batch, and its pass for the last rank's end
    slowest = {
        "first_s": max(r["first"] - r["t0"] for r in every),
        "seconds": max(r["end"] - r["t0"] for r in every),
    }
    return {**result, "world_size": len(every), "slowest": slowest}


def main(argv: list[str]) -> None:
    import torch  # noqa: F401  (before the clock: every run has these)

    import shardstream  # noqa: F401

    spec = json.loads(argv[0])
    result = ddp(spec) if spec["kind"] == "ddp" else measure(spec)
    if result is not None:
        print(PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
