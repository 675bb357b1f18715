"""The layout a write makes: how many shards, which input records each is made from, and
the rows of its row groups, chosen for the job that will read them (sampler.advice, the
planner's own arithmetic).

The output's bytes a row and records (``map`` may split or drop records) are measured on
a sample: the source's first records, mapped in batches as the write maps them and
encoded to Parquet in memory. The sample is the same whatever ``num_proc``, so the layout
is too. Shard k is made from the input records [k N / S, (k + 1) N / S): every record
goes to exactly one shard, and a shard's bytes do not depend on which process wrote it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstream.sampler.advice import GROUP_BYTES, advise, worst_amplification

from .sources import Source, locate, unit_pieces

__all__ = [
    "DEFAULT_GROUP_BYTES",
    "SAMPLE_ROWS",
    "Layout",
    "choose_layout",
    "dictionary_columns",
    "mapped_batches",
    "sample",
]

SAMPLE_ROWS = 8192  # the input records the layout is measured on
DEFAULT_GROUP_BYTES = GROUP_BYTES[0]  # no job given: 1 MB groups split among many readers


@dataclass(frozen=True)
class Layout:
    """`num_shards` shards of `rows_per_group`-row groups, from `num_records` input
    records (shard k: input records `bounds[k]` to `bounds[k + 1]`)."""

    num_records: int
    num_shards: int
    rows_per_group: int
    bytes_per_row: float  # the output's, in Parquet, as sampled
    records_out: int  # about the output's records (the sample's ratio)
    worst_amplification: float | None  # the bound for the job given (None: no job)

    def bounds(self, k: int) -> tuple[int, int]:
        n, s = self.num_records, self.num_shards
        return k * n // s, (k + 1) * n // s


def mapped_batches(
    tables: Iterator[pa.Table],
    fn: Callable[[dict[str, list[Any]]], dict[str, list[Any]]] | None,
    batch_size: int,
    schema: pa.Schema | None,
    where: Callable[[int], str],
) -> Iterator[pa.Table]:
    """The input tables re-cut into batches of `batch_size` rows (the last shorter), each
    through `fn` (a dict of column -> list in and out, as datasets' batched map) and made
    a table of `schema` (None: inferred). Without `fn` the tables pass through, uncut.
    `where(i)` names the input of the batch starting at row i, for errors."""
    if fn is None:
        yield from tables
        return
    held: list[pa.Table] = []
    count = done = 0

    def one(batch: pa.Table) -> pa.Table:
        try:
            out = fn(batch.to_pydict())
        except Exception as e:
            raise ValueError(f"map failed on {where(done)}: {type(e).__name__}: {e}") from e
        if not isinstance(out, dict):
            raise ValueError(f"map returned a {type(out).__name__} on {where(done)}, not a dict")
        try:
            return pa.Table.from_pydict(out, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, KeyError) as e:
            raise ValueError(
                f"map's output for {where(done)} does not fit the output schema measured on "
                f"the first records ({schema}): {e}"
            ) from e

    for table in tables:
        held.append(table)
        count += table.num_rows
        while count >= batch_size:
            joined = pa.concat_tables(held)
            yield one(joined.slice(0, batch_size))
            done += batch_size
            rest = joined.slice(batch_size)
            held, count = [rest], rest.num_rows
    if count:
        yield one(pa.concat_tables(held))


def dictionary_columns(table: pa.Table) -> list[str]:
    """The flat columns worth dictionary-encoding: at most one distinct value in two rows
    of the sample. (pyarrow encodes every column by dictionary unless told, and falls
    back only past 1 MB of dictionary: in row groups of 1-16 MB a column of distinct
    strings is encoded whole, larger and slower to write.)"""
    out = []
    for field, column in zip(table.schema, table.columns):
        if pa.types.is_nested(field.type) or not table.num_rows:
            continue
        distinct = pc.count_distinct(column).as_py()
        if distinct * 2 <= max(1, table.num_rows - column.null_count):
            out.append(field.name)
    return out


def sample(
    source: Source,
    fn: Callable[[dict[str, list[Any]]], dict[str, list[Any]]] | None,
    batch_size: int,
    compression: str,
) -> tuple[int, int, int, pa.Schema, list[str]]:
    """(input records, output records, their Parquet bytes, the output schema, the
    columns to dictionary-encode) of the source's first SAMPLE_ROWS records (with a
    `map`, its first batch_size records, at least 1,024: the map runs again as written)."""
    rows = min(source.num_records, SAMPLE_ROWS if fn is None else max(batch_size, 1024))
    pieces = unit_pieces(source.counts, 0, rows)
    tables = (t for unit, a, b in pieces for t in source.read(unit, a, b))
    out = list(mapped_batches(tables, fn, batch_size, None, locate(source, 0, rows)))
    if not out:
        return rows, 0, 0, source.schema, []
    schema = out[0].schema.remove_metadata()  # (pandas' metadata describes the source)
    table = pa.concat_tables([t.cast(schema) for t in out])
    dictionary = dictionary_columns(table)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression=compression, use_dictionary=dictionary)
    return rows, table.num_rows, buf.tell(), schema, dictionary


def choose_layout(
    num_records: int,
    sampled: tuple[int, int, int],
    world_size: int | None,
    workers: int | None,
    shard_bytes: int | None,
    row_group_rows: int | None,
) -> Layout:
    """The layout for `world_size` ranks x `workers` readers (sampler.advice.advise:
    the largest row groups, at most 16 MB, that keep every reader within 1.1x, in shards
    of about 256 MB); without a job, 1 MB groups in 256 MB shards. `shard_bytes` and
    `row_group_rows` override."""
    sample_in, sample_out, sample_bytes = sampled
    ratio = sample_out / sample_in if sample_in else 1.0
    records_out = max(0, round(num_records * ratio))
    per_row = sample_bytes / sample_out if sample_out else 1.0
    job = world_size is not None
    a = advise(
        max(records_out, 1),
        world_size or 1,
        workers or 1,
        bytes_per_row=max(per_row, 1e-9),
    )
    shards, rows = a.num_shards, a.rows_per_group
    if not job:
        rows = max(1, min(a.rows_per_shard, int(DEFAULT_GROUP_BYTES // max(per_row, 1e-9))))
    if shard_bytes is not None:
        shards = max(1, math.ceil(records_out * per_row / shard_bytes))
    if row_group_rows is not None:
        rows = row_group_rows
    shards = max(1, min(shards, num_records))
    worst = None
    if job:
        worst = worst_amplification(rows, a.records_per_reader)
    return Layout(num_records, shards, rows, per_row, records_out, worst)
