"""Gathering rows of a block of Parquet parts into columns, in one pass over the bytes.

pyarrow's take() on a table of many chunks first concatenates the chunks, and
concatenating the parts of a block costs a full copy of it; on a shuffled read the
gather is a second. Here each numeric column (and list column of fixed row length) of
each Arrow chunk is viewed as a numpy array without copying, and a gather writes each
asked row once into a fresh array. Other columns (strings, nulls) go through Arrow.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..batching import numpy_view

__all__ = ["Block"]


class Block:
    """The parts (Arrow tables) of one block; row i of the block is row i of the parts laid
    end to end."""

    def __init__(self, parts: Sequence[pa.Table]) -> None:
        self.names = parts[0].column_names if parts else []
        self._views: dict[str, tuple[list[np.ndarray], npt.NDArray[np.int64]] | None] = {}
        self._joined: dict[str, pa.Array] = {}
        self._parts = list(parts)

    def _chunks(self, name: str) -> tuple[list[np.ndarray], npt.NDArray[np.int64]] | None:
        """Numpy views of the column's chunks and where each starts; None if not viewable."""
        if name not in self._views:
            chunks = [c for p in self._parts for c in p.column(name).chunks]
            views = [numpy_view(c) for c in chunks]
            ok = all(v is not None for v in views) and len({v.shape[1:] for v in views}) <= 1  # type: ignore[union-attr]
            starts = np.cumsum([0] + [len(c) for c in chunks])
            self._views[name] = (
                ([v for v in views if v is not None], starts) if ok and views else None
            )
        return self._views[name]

    def _arrow(self, name: str) -> pa.Array:
        if name not in self._joined:
            col = pa.chunked_array([c for p in self._parts for c in p.column(name).chunks])
            self._joined[name] = col.combine_chunks()
        return self._joined[name]

    @staticmethod
    def records(columns: dict[str, Any], step: int = 1024) -> Iterator[dict[str, Any]]:
        """Taken columns as {column: value} rows, made `step` rows at a time (small runs of
        Python objects stay in cache: about twice as fast as one big run)."""
        names = list(columns)
        n = len(next(iter(columns.values()))) if columns else 0
        for lo in range(0, n, step):
            values = [
                c[lo : lo + step].tolist()
                if isinstance(c, np.ndarray)
                else c.slice(lo, step).to_pylist()
                for c in columns.values()
            ]
            for row in zip(*values):
                yield dict(zip(names, row))

    def take(self, rows: npt.NDArray[np.int64]) -> dict[str, Any]:
        """Rows of the block, in order: column -> numpy array or Arrow array."""
        out: dict[str, Any] = {}
        for name in self.names:
            chunks = self._chunks(name)
            if chunks is None:
                out[name] = self._arrow(name).take(pa.array(rows))
                continue
            views, starts = chunks
            # (n,) the chunk holding each row; then the rows grouped by chunk
            which = np.searchsorted(starts, rows, side="right") - 1
            order = np.argsort(which, kind="stable")
            bounds = np.searchsorted(which[order], np.arange(len(views) + 1))
            res = np.empty((rows.size, *views[0].shape[1:]), dtype=views[0].dtype)
            for c in range(len(views)):
                sel = order[bounds[c] : bounds[c + 1]]
                if sel.size:
                    res[sel] = views[c][rows[sel] - starts[c]]
            out[name] = res
        return out
