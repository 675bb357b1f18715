"""Reading a shard of a selected index (loader.selection): only some of its rows are
records.

A selected shard's details hold, beside the row groups (or Arrow record batches) as
stored, ``selected``: the storage rows that are records, ascending, and ``stored_rows``:
each group's stored row count; its ``row_group_rows`` then count the *selected* rows of
each group. Planning and `row_groups` work in record positions, so a group with no
selected row is never fetched; the decode reads the stored groups and keeps the
selected rows of the asked range (`pick`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .parquet.meta import read_groups

__all__ = ["pick", "record_groups", "stored_rows"]


def stored_rows(details: dict[str, Any]) -> list[int]:
    """Each row group's (record batch's) rows as stored in the file."""
    rows: list[int] = details.get("stored_rows", details["row_group_rows"])
    return rows


def record_groups(details: dict[str, Any]) -> list[int]:
    """Records of each read group of a Parquet or Arrow IPC shard (`read_groups`); of a
    selected shard, of its groups holding a selected row (the others are never read)."""
    rows, sizes = details.get("row_group_rows", []), details.get("row_group_bytes", [])
    if "selected" in details:
        sizes = [b for n, b in zip(rows, sizes) if n]
        rows = [n for n in rows if n]
    return read_groups(rows, sizes)


def pick(table: pa.Table, details: dict[str, Any], groups: Sequence[int], lo: int, hi: int) -> Any:
    """Records [lo, hi) of `table` (the rows of row groups `groups`, as stored), counted
    from the first record of those groups: a slice for a whole shard, the selected rows of
    a selected one."""
    selected = details.get("selected")
    if selected is None:
        return table.slice(lo, hi - lo)
    stored = details["stored_rows"]
    first = np.concatenate(([0], np.cumsum(stored, dtype=np.int64)))
    where, at = [], 0  # the selected rows of each group read, as rows of `table`
    for g in groups:
        a, b = np.searchsorted(selected, (first[g], first[g + 1]))
        where.append(selected[a:b] - first[g] + at)
        at += int(stored[g])
    rows = np.concatenate(where) if where else np.zeros(0, np.int64)
    return table.take(pa.array(rows[lo:hi], pa.int64()))
