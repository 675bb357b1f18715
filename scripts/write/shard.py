"""One output shard: its input records read, mapped, written as Parquet row groups of the
layout's rows, and made visible under its final name only when whole.

Visibility: on local disk the shard is written under a hidden name (``.part-00003.parquet
.<pid>.tmp``) and renamed; an object store's upload (S3's multipart upload, GCS's
resumable one, Azure's block list) makes the object visible only when it completes, so
the shard is written under its name and, on an error, the upload is discarded (fsspec's
``discard``), never completed. A killed process leaves nothing under a shard's name.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstream.loader.formats import format_for
from shardstream.loader.storage.filesystems import (
    FileEntry,
    filesystem,
    is_local,
    redact,
)
from shardstream.loader.storage.listing import file_entry

from .layout import Layout, mapped_batches
from .sources import Source, locate, unit_pieces

__all__ = ["Done", "Job", "read_back", "shard_name", "write_shard"]

MapFn = Callable[[dict[str, list[Any]]], dict[str, list[Any]]]


def shard_name(k: int) -> str:
    return f"part-{k:05d}.parquet"


@dataclass
class Job:
    """What a process needs to write any shard of the layout (pickled to each process)."""

    source: Source
    layout: Layout
    dest: str
    fn: MapFn | None
    batch_size: int
    schema: pa.Schema  # the output's
    compression: str
    tokens_column: str | None
    storage_options: dict[str, Any] | None
    dictionary: list[str]  # the columns dictionary-encoded (layout.dictionary_columns)


@dataclass
class Done:
    """A whole shard: its file entry, its index entry (a footer scan), records, and each
    record's token count in `tokens_column` (None when not asked)."""

    k: int
    entry: FileEntry
    scanned: dict[str, Any]
    records: int
    tokens: np.ndarray | None


def _tables(job: Job, k: int) -> Iterator[pa.Table]:
    """Shard k's input records, in order."""
    a, b = job.layout.bounds(k)
    for unit, lo, hi in unit_pieces(job.source.counts, a, b):
        for table in job.source.read(unit, lo, hi):
            yield table.cast(job.source.schema) if table.schema != job.source.schema else table


def _groups(tables: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """The tables re-cut into tables of exactly `rows` rows (the last shorter)."""
    held: list[pa.Table] = []
    count = 0
    for table in tables:
        held.append(table)
        count += table.num_rows
        while count >= rows:
            joined = pa.concat_tables(held)
            yield joined.slice(0, rows)
            rest = joined.slice(rows)
            held, count = [rest], rest.num_rows
    if count:
        yield pa.concat_tables(held)


def _token_counts(table: pa.Table, column: str) -> np.ndarray:
    lengths = pc.fill_null(pc.list_value_length(table.column(column)), 0)
    return np.asarray(lengths.to_numpy(), dtype=np.int32)


def _write(job: Job, k: int, f: Any) -> tuple[int, np.ndarray | None]:
    where = locate(job.source, *job.layout.bounds(k))
    mapped = mapped_batches(_tables(job, k), job.fn, job.batch_size, job.schema, where)
    records, counts = 0, []
    options = {"compression": job.compression, "use_dictionary": job.dictionary}
    with pq.ParquetWriter(f, job.schema, **options) as writer:
        for group in _groups(mapped, job.layout.rows_per_group):
            if group.schema != job.schema:
                group = group.cast(job.schema)
            writer.write_table(group, row_group_size=job.layout.rows_per_group)
            records += group.num_rows
            if job.tokens_column is not None:
                counts.append(_token_counts(group, job.tokens_column))
    tokens = None
    if job.tokens_column is not None:
        tokens = np.concatenate(counts) if counts else np.zeros(0, np.int32)
    return records, tokens


def write_shard(job: Job, k: int) -> Done:
    """Write shard k whole (see the module's docstring); ValueError naming the source
    file on bad input, and nothing left under the shard's name."""
    url = f"{job.dest}/{shard_name(k)}"
    fs, path = filesystem(url, job.storage_options)
    if is_local(fs):
        tmp = f"{os.path.dirname(path)}/.{shard_name(k)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                records, tokens = _write(job, k, f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    else:
        f = fs.open(path, "wb")
        try:
            records, tokens = _write(job, k, f)
        except BaseException:
            f.discard()  # abort the upload: nothing becomes visible
            f.closed = True
            raise
        f.close()
    return _done(job, k, url, records, tokens)


def _done(job: Job, k: int, url: str, records: int | None, tokens: np.ndarray | None) -> Done:
    """Shard k as the index holds it: its size and version now, and its footer; the
    records written (None: a shard found whole, counted by its footer)."""
    entry = file_entry(url, job.storage_options)
    fs, _ = filesystem(url, job.storage_options)
    (scanned,) = format_for("parquet").scan(fs, [entry])
    found = int(scanned["num_records"])
    if records is not None and found != records:
        raise RuntimeError(f"{redact(url)}: {found} records, {records} written")
    return Done(k, entry, scanned, found, tokens)


def read_back(job: Job, k: int) -> Done:
    """A shard found whole (a resumed write): its entry, footer and token counts, read."""
    url = f"{job.dest}/{shard_name(k)}"
    tokens = None
    if job.tokens_column is not None:
        fs, path = filesystem(url, job.storage_options)
        with fs.open(path, "rb") as f:
            table = pq.read_table(f, columns=[job.tokens_column])
        tokens = _token_counts(table, job.tokens_column)
    return _done(job, k, url, None, tokens)
