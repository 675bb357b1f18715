"""write_shards: any source to Parquet shards laid out for the job that reads them, in
parallel processes, to any store, resumable, with the index saved beside the shards.

The data flow, one way: the source (write.sources; records in memory spilled first,
write.spill) -> a sample measured (write.layout) -> the layout and the progress record
(write.progress) -> each shard written whole by one of `num_proc` processes, each
reading its own input (write.shard) -> the index of the shards saved beside them.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import pickle
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from shardstream.loader.index.beside import INDEX_NAME, save_beside
from shardstream.loader.index.listing import Listing
from shardstream.loader.index.shard_index import ShardIndex
from shardstream.loader.storage.filesystems import as_url, filesystem, redact
from shardstream.loader.tokens.lengths import lengths_column
from shardstream.sampler.checks import parse_size

from .layout import Layout, choose_layout, sample
from .progress import check_progress, found_shards, leftovers
from .shard import Done, Job, MapFn, read_back, write_shard
from .sources import IndexedSource, Source, TextSource, count_text, is_in_memory, text_entries
from .spill import SPILL_DIR, finished_spill, spill

__all__ = ["WriteSummary", "write_shards"]

log = logging.getLogger("shardstream.write")


@dataclass(frozen=True)
class WriteSummary:
    """What a write made: `shards` Parquet files holding `records` records in `bytes`
    bytes under `dest` (`written` of them by this call: the rest were whole already),
    row groups of `rows_per_group` rows, the index at `index`; `worst_amplification`:
    the most any reader of the job given (world_size x workers) fetches over its
    records' share, measured on the shards written (None without a job)."""

    dest: str
    shards: int
    records: int
    bytes: int
    seconds: float
    rows_per_group: int
    written: int
    index: str
    worst_amplification: float | None

    def __str__(self) -> str:
        amp = (
            ""
            if self.worst_amplification is None
            else f"; worst reader {self.worst_amplification:.2f}x"
        )
        rate = self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        return (
            f"{self.shards:,} shards ({self.written:,} written now), {self.records:,} records, "
            f"{self.bytes / 1e6:,.1f} MB in {self.seconds:.1f} s ({rate:,.1f} MB/s), "
            f"{self.rows_per_group:,} rows a row group{amp}; index {redact(self.index)}"
        )


_JOB: Job | None = None  # the job of this writer process (set once by _init)


def _init(job: Job | None, env: dict[str, str] | None = None) -> None:
    """This process's job; `env`: the caller's environment as it is now (a fork server's
    children would otherwise have the environment it started with)."""
    global _JOB
    _JOB = job
    if env is not None:
        os.environ.clear()
        os.environ.update(env)


def _task(task: tuple[str, int]) -> Done:
    kind, k = task
    assert _JOB is not None
    return write_shard(_JOB, k) if kind == "write" else read_back(_JOB, k)


def _run_of(tasks: list[tuple[str, int]]) -> list[Done]:
    """Consecutive shards, in order (a source read group they share is decoded once)."""
    return [_task(t) for t in tasks]


def _context() -> Any:
    """Fresh processes from a fork server that has imported the writer once: each starts
    in milliseconds, and none inherits the caller's threads (a tokenizer's pool, torch's)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shardstream.write.shard"])
    from multiprocessing import forkserver

    forkserver.ensure_running()  # it imports the writer while this process works on
    return ctx


def _check(
    num_proc: int,
    world_size: int | None,
    workers: int | None,
    shard_bytes: int | None,
    row_group_rows: int | None,
    batch_size: int,
    fn: MapFn | None,
) -> None:
    for name, value in (
        ("num_proc", num_proc),
        ("world_size", world_size),
        ("workers", workers),
        ("shard_bytes", shard_bytes),
        ("row_group_rows", row_group_rows),
        ("batch_size", batch_size),
    ):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if workers is not None and world_size is None:
        raise ValueError("workers is given without world_size: give the job's ranks too")
    if fn is not None and not callable(fn):
        raise ValueError(f"map must be a function of a batch, got {type(fn).__name__}")
    if fn is not None and num_proc > 1:
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise ValueError(
                f"map {fn!r} cannot be sent to num_proc={num_proc} processes ({e}): use a "
                "function defined at a module's top level (or a functools.partial of one)"
            ) from e


def _source(
    source: Any,
    dest: str,
    columns: list[str] | None,
    storage_options: dict[str, Any] | None,
    num_proc: int,
) -> Source:
    if is_in_memory(source):
        files = finished_spill(dest, storage_options) or spill(source, dest, storage_options)
        index = ShardIndex.build(files, storage_options)
        return IndexedSource(index, columns, storage_options, spilled=True)
    text = text_entries(source, storage_options)  # text files named: nothing listed
    if text is None:
        try:
            index = ShardIndex.resolve(source, storage_options)
        except FileNotFoundError:  # no shards: a folder of text files?
            text = text_entries(source, storage_options, folders=True)
            if text is None:
                raise
    if text is not None:
        kind, entries = text
        args = [(kind, e, storage_options) for e in entries]
        if num_proc > 1 and len(args) > 1:  # one pass over each file, in parallel
            with ProcessPoolExecutor(min(num_proc, len(args)), _context()) as pool:
                counted = list(pool.map(count_text, *zip(*args)))
        else:
            counted = [count_text(*a) for a in args]
        return TextSource(kind, entries, counted, columns, storage_options)
    return IndexedSource(index, columns, storage_options)


def _name(fn: MapFn | None) -> str | None:
    """`fn` as the progress record names it (the same in every run: no address)."""
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return f"partial({_name(fn.func)}, {fn.args!r}, {fn.keywords!r})"
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _worst(index: ShardIndex, world_size: int, workers: int) -> float | None:
    from shardstream.loader.read.amplification import job_amplification
    from shardstream.sampler import ShardSampler

    sampler = ShardSampler(index, num_replicas=world_size, rank=0, shuffle=True)
    worst = job_amplification(index, sampler, workers, 1)
    return None if worst is None else worst[0]


def _index(dones: list[Done], layout: Layout, job: Job) -> ShardIndex:
    dones = sorted(dones, key=lambda d: d.k)
    listing = Listing("parquet", [d.entry for d in dones])
    index = ShardIndex.assembled(listing, [d.scanned for d in dones], job.storage_options)
    if job.tokens_column is not None:
        counts = [d.tokens if d.tokens is not None else np.zeros(0, np.int32) for d in dones]
        offsets = np.concatenate(([0], np.cumsum([c.size for c in counts]))).astype(np.int64)
        values = np.concatenate(counts) if counts else np.zeros(0, np.int32)
        column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))
        index.table = index.table.append_column(lengths_column(job.tokens_column), column)
    return index


def _parallel(job: Job, tasks: list[tuple[str, int]], num_proc: int) -> Iterator[Done]:
    """The tasks in `num_proc` processes (`_context`), each given the job once, in runs of
    consecutive shards (about 4 a process); results as runs finish. A process that dies
    (killed, out of memory) is a RuntimeError, never a wait: what was whole stays, and
    the write can be resumed."""
    size = max(1, -(-len(tasks) // (4 * num_proc)))
    runs = [tasks[i : i + size] for i in range(0, len(tasks), size)]
    with ProcessPoolExecutor(
        num_proc, _context(), initializer=_init, initargs=(job, dict(os.environ))
    ) as pool:
        futures = [pool.submit(_run_of, run) for run in runs]
        try:
            for future in as_completed(futures):
                yield from future.result()
        except BrokenProcessPool as e:
            raise RuntimeError(
                f"a writing process of {redact(job.dest)} died ({e}): the shards whole so "
                "far stay; run the write again with the same arguments to finish it"
            ) from None
        finally:
            for future in futures:
                future.cancel()


def _run(job: Job, tasks: list[tuple[str, int]], num_proc: int, bar: bool) -> Iterator[Done]:
    writes = any(kind == "write" for kind, _ in tasks)
    results = _parallel(job, tasks, num_proc) if num_proc > 1 and writes else _serial(job, tasks)
    yield from tqdm(results, total=len(tasks), unit="shard", disable=not bar)


def _serial(job: Job, tasks: list[tuple[str, int]]) -> Iterator[Done]:
    _init(job)
    try:
        for task in tasks:
            yield _task(task)
    finally:
        _init(None)


def write_shards(
    source: Any,
    dest: str,
    *,
    map: MapFn | None = None,
    num_proc: int = 1,
    world_size: int | None = None,
    workers: int | None = None,
    shard_bytes: int | str | None = None,
    row_group_rows: int | None = None,
    columns: list[str] | None = None,
    batch_size: int = 1000,
    compression: str = "snappy",
    tokens_column: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> WriteSummary:
    """Write `source` to Parquet shards ``part-00000.parquet``, ... under `dest` (a local
    folder or any fsspec URL), laid out for `world_size` ranks x `workers` DataLoader
    workers, and save their index beside them; see docs/writing.md.

    `source`: anything ``StreamingDataset`` reads, JSON Lines or CSV files, an iterable of
    dicts, a pyarrow Table or a pandas DataFrame. `map`: a function of a batch (column ->
    list of `batch_size` input records) returning a batch of any length, run in the
    `num_proc` processes that each read their own share. The layout: the largest row
    groups (at most 16 MB) that keep every reader of the job within 1.1x its records,
    in shards of about 256 MB (1 MB groups without a job); `shard_bytes` ("256MB") and
    `row_group_rows` override. Every record lands in exactly one shard; the same source
    and options give the same shards whatever `num_proc`. A shard is visible only when
    whole; a write started again after being killed keeps the shards already whole and
    writes the rest. `tokens_column`: the index keeps each record's token count (for
    ``Pack``). ValueError naming the source file on bad input."""
    began = time.perf_counter()
    fn = map
    shard_bytes = parse_size(shard_bytes, "shard_bytes")  # "256MB" or bytes
    _check(num_proc, world_size, workers, shard_bytes, row_group_rows, batch_size, fn)
    dest = str(as_url(dest)).rstrip("/")
    if num_proc > 1:
        _context()  # the fork server starts now, importing while the source is indexed
    src = _source(source, dest, columns, storage_options, num_proc)
    if tokens_column is not None and fn is None and tokens_column not in src.schema.names:
        raise ValueError(f"tokens_column {tokens_column!r} is not a column: {src.schema}")
    taken, made, made_bytes, schema, dictionary = sample(src, fn, batch_size, compression)
    measured = (taken, made, made_bytes)
    layout = choose_layout(
        src.num_records, measured, world_size, workers, shard_bytes, row_group_rows
    )
    doc = {
        "source": src.identity(),
        "options": {
            "map": _name(fn),
            "batch_size": batch_size,
            "compression": compression,
            "tokens_column": tokens_column,
            "columns": columns,
            "dictionary": dictionary,
        },
        "layout": asdict(layout),
    }
    names = check_progress(dest, storage_options, doc)
    leftovers(dest, storage_options, names)
    found = found_shards(names, layout.num_shards, dest)
    job = Job(
        src,
        layout,
        dest,
        fn,
        batch_size,
        schema,
        compression,
        tokens_column,
        storage_options,
        dictionary,
    )
    tasks = [("read" if k in found else "write", k) for k in range(layout.num_shards)]
    dones = list(_run(job, tasks, num_proc, progress))
    index = _index(dones, layout, job)
    index_url = f"{dest}/{INDEX_NAME}"
    save_beside(index, index_url, storage_options)
    if isinstance(src, IndexedSource) and is_in_memory(source):
        fs, path = filesystem(f"{dest}/{SPILL_DIR}", storage_options)
        fs.rm(path, recursive=True)
    summary = WriteSummary(
        dest=dest,
        shards=layout.num_shards,
        records=sum(d.records for d in dones),
        bytes=sum(d.entry.size for d in dones),
        seconds=time.perf_counter() - began,
        rows_per_group=layout.rows_per_group,
        written=sum(1 for kind, _ in tasks if kind == "write"),
        index=index_url,
        worst_amplification=None if world_size is None else _worst(index, world_size, workers or 1),
    )
    log.info("wrote %s", summary)
    return summary
