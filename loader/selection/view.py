"""The selected index: an index whose records are some rows of each shard.

Built from an index and, per shard, the storage rows that are records (ascending). Its
table is the index's with ``records`` the selected count of each shard, ``row_group_rows``
the selected rows of each row group (so planning and reading count records, and a group of
none is never read), ``stored_rows`` the row groups as stored and ``selected`` the rows
(loader.formats.selected reads them). Token counts (``tokens:<column>``) are kept for the
selected documents; other kept results (``filter:...``) stay with the source index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..index.shard_index import ShardIndex
from ..index.table import numbers, one_array

__all__ = ["list_array", "selected_index"]

Rows = npt.NDArray[np.int64] | npt.NDArray[np.int32]


def list_array(values: Sequence[Rows], kind: pa.DataType | None = None) -> pa.Array:
    """A large list array of one list a shard, of `kind` numbers (default int64)."""
    sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    flat = np.concatenate(values) if len(values) else np.zeros(0, np.int64)
    return pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(flat.astype(np.int64), kind or pa.int64())
    )


def selected_index(index: ShardIndex, rows: Sequence[Rows]) -> ShardIndex:
    """`index` with only `rows[s]` (ascending storage rows) of each shard s as records."""
    table = index.table
    stored = one_array(table.column("row_group_rows"))
    per_group = []
    for s, r in enumerate(rows):
        counts = np.asarray(stored[s].values.to_numpy(zero_copy_only=False), dtype=np.int64)
        first = np.concatenate(([0], np.cumsum(counts)))
        per_group.append(np.diff(np.searchsorted(r, first)).astype(np.int64))
    sizes = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    base_sizes = numbers(table.column("records"))
    starts = np.concatenate(([0], np.cumsum(base_sizes)))[:-1]
    out = table
    for name in table.column_names:
        if name.startswith("filter:"):
            out = out.drop_columns([name])
        elif name.startswith("tokens:"):  # per document: the selected ones' counts
            counts = pc.list_flatten(one_array(table.column(name))).to_numpy(zero_copy_only=False)
            kept = [counts[starts[s] + r] for s, r in enumerate(rows)]
            column = list_array(kept, pa.int32())
            out = out.set_column(
                out.schema.get_field_index(name), name, column.cast(table.schema.field(name).type)
            )
    out = out.set_column(out.schema.get_field_index("records"), "records", pa.array(sizes))
    out = out.set_column(
        out.schema.get_field_index("row_group_rows"),
        "row_group_rows",
        list_array(per_group).cast(pa.list_(pa.int64())),
    )
    for name in ("stored_rows", "selected"):
        if name in out.column_names:
            raise ValueError("this index is selected already: select from its source index")
    out = out.append_column("stored_rows", stored)
    out = out.append_column("selected", list_array(list(rows)).cast(pa.list_(pa.int64())))
    return ShardIndex(
        schemas=index.schemas,
        partitioning=index.partitioning,
        table=out.combine_chunks(),
        format=index.format,
    )
