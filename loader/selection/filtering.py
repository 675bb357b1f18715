"""`filter=`: which rows of each shard pass a pyarrow expression, decided once per shard.

Parquet: pyarrow.dataset's fragment of the shard drops the row groups whose statistics
exclude the expression (`split_by_row_group`), and the others are scanned for the
expression's value alone (a projection: pyarrow reads only the columns it names), so the
cost is about ``pyarrow.dataset(...).to_table(filter=..., columns=[...])``'s. Arrow IPC:
the shard's rows read, the expression evaluated on them. A null value does not pass (as
in pyarrow's filters).

The passing rows are kept in the source index's table as the column ``filter:<expr>``
(per shard, a list of int32 rows), as token counts are, so ``ds.index.save(...)`` keeps
them and a job started from the saved index evaluates nothing. Under a process group each
rank evaluates 1/R of the shards (loader.index.distributed.per_shard).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardError, StaleIndexError
from ..formats import Format
from ..index.distributed import per_shard
from ..index.shard_index import ShardIndex
from ..index.table import numbers, one_array
from ..storage.filesystems import filesystem, is_local, redact
from ..storage.retry import RetryPolicy
from .view import list_array

__all__ = ["FILTER_THREADS", "check_filter", "filter_column", "passing_rows"]

log = logging.getLogger("shardstream.loader.selection")
FILTER_THREADS = 8
_KEEP = "__shardstream_keep"


def check_filter(expr: object) -> pc.Expression | None:
    """`expr` as given when it is a pyarrow.compute.Expression (or None); TypeError
    naming anything else."""
    if expr is None or isinstance(expr, pc.Expression):
        return expr
    raise TypeError(
        f"filter must be a pyarrow.compute.Expression, e.g. pc.field('lang') == 'en' "
        f"(import pyarrow.compute as pc), got {expr!r} ({type(expr).__name__})"
    )


def filter_column(expr: pc.Expression) -> str:
    """The index table's column keeping the rows that pass `expr`."""
    return f"filter:{expr}"


@functools.cache
def _ranged_files() -> Any:
    """pyarrow.fs.FSSpecHandler without fsspec's read-ahead cache: pyarrow asks for the
    byte ranges it needs (the footer, the kept groups' filter columns, coalesced), and each
    is one ranged read. (s3fs's default cache reads whole blocks of many MB from where
    pyarrow seeks, fetching far more than the columns asked for.) Made when first needed:
    pyarrow.dataset and pyarrow.fs import pandas, ~350 modules a dataset without a filter
    should not pay for (at import, and in every full garbage collection after)."""
    import pyarrow.fs as pafs

    class RangedFiles(pafs.FSSpecHandler):  # type: ignore[misc]
        def open_input_file(self, path: str) -> Any:
            return pa.PythonFile(self.fs.open(path, mode="rb", cache_type="none"), mode="r")

    return RangedFiles


def _parquet_rows(fs: Any, url: str, expr: pc.Expression) -> tuple[npt.NDArray[np.int64], int]:
    """(the passing rows, the file's rows) of a Parquet file."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    path = fs._strip_protocol(url)
    arrow_fs = pafs.LocalFileSystem() if is_local(fs) else pafs.PyFileSystem(_ranged_files()(fs))
    fragment = pads.ParquetFileFormat().make_fragment(path, filesystem=arrow_fs)
    meta = fragment.metadata
    stored = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
    first = np.concatenate(([0], np.cumsum(stored)))
    kept = [
        f.row_groups[0].id
        for f in fragment.split_by_row_group(filter=expr, schema=fragment.physical_schema)
    ]
    if not kept:
        return np.zeros(0, np.int64), int(first[-1])
    scanned = fragment.subset(row_group_ids=kept).to_table(
        schema=fragment.physical_schema, columns={_KEEP: expr}, use_threads=False
    )
    keep = _passing(scanned.column(_KEEP))
    # the scanned rows are those of the kept groups, in order: back to storage rows
    starts = np.repeat(
        first[kept] - np.concatenate(([0], np.cumsum(stored[kept])))[:-1], stored[kept]
    )
    return keep + starts[keep], int(first[-1])


def _passing(values: pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """Positions of the true values (null: not passing)."""
    mask = pc.fill_null(values.cast(pa.bool_()), False)
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False)).astype(np.int64)


def passing_rows(
    index: ShardIndex,
    fmt: Format,
    expr: pc.Expression,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> list[npt.NDArray[np.int64]]:
    """Per shard, its rows passing `expr` (ascending): kept in `index`'s table if it holds
    them (``filter:<expr>``), else evaluated (logged at INFO with the advice to save the
    index) and added to it. A shard whose rows differ from the index's is a
    StaleIndexError naming it; an expression the shard cannot evaluate (a column it lacks,
    a type it cannot compare) a ShardError naming both."""
    import pyarrow.dataset as pads

    name = filter_column(expr)
    sizes = index.shard_sizes
    if name in index.table.column_names:
        kept = one_array(index.table.column(name))
        flat = numbers(pc.list_flatten(kept)).astype(np.int64)
        offsets = numbers(kept.offsets).astype(np.int64)
        offsets -= offsets[0]
        out = [flat[offsets[s] : offsets[s + 1]] for s in range(len(index))]
        if any(len(r) and r[-1] >= n for r, n in zip(out, sizes)):
            raise StaleIndexError(f"the index's {name!r} names rows its shards lack: rebuild it")
        return out
    began = time.perf_counter()
    if not len(index):
        return []
    fs, _ = filesystem(index.shards[0].url, storage_options)

    def evaluate(s: int) -> npt.NDArray[np.int32]:
        shard = index.shards[s]
        if shard.num_records == 0:
            return np.zeros(0, np.int32)
        try:
            if index.format == "parquet":
                rows, total = _parquet_rows(fs, shard.url, expr)
            else:
                table = fmt.read(fs, shard, 0, shard.num_records, None)
                total = table.num_rows
                keep = pads.dataset(table).to_table(columns={_KEEP: expr}).column(_KEEP)
                rows = _passing(keep)
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(shard.url)}: shard not found") from None
        except (pa.ArrowException, OSError) as e:
            raise ShardError(f"{redact(shard.url)}: cannot evaluate filter {expr}: {e}") from e
        if total != shard.num_records:
            raise StaleIndexError(
                f"{redact(shard.url)}: {total} rows, the index has {shard.num_records}: "
                "rebuild the index"
            )
        return rows.astype(np.int32)

    parts = per_shard(evaluate, list(range(len(index))), "the filter's rows", FILTER_THREADS)
    index.table = index.table.append_column(name, list_array(parts, pa.int32()))
    passed = sum(len(p) for p in parts)
    log.info(
        "evaluated filter %s over %d shards in %.2f s: %d of %d records pass; "
        "ds.index.save('<path>.index.arrow') keeps which, so a job started from that saved "
        "index evaluates nothing",
        expr,
        len(index),
        time.perf_counter() - began,
        passed,
        int(sizes.sum()),
    )
    return [p.astype(np.int64) for p in parts]
