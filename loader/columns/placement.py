"""Where each row of a batch comes from, decided once and applied to every column.

A batch is gathered from several parts (the decoded groups of a reader, or of all a
mixture's streams at once): row i of the batch is row ``rows[i]`` of part ``which[i]``.
Every column of the batch, whatever it holds (numpy numbers, stacked lists, Python
objects, Arrow strings and lists), is placed by the one `Placement`, so a row of a batch
is always one record: no column can be put in another order than the others. (Two
hand-written placements, one for numpy and one for Arrow, once disagreed: a mixture paired
one record's numbers with another's strings.)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardstream.sampler.plan import stable_order

from .arrow_numpy import indices

__all__ = ["Placement"]

I64 = npt.NDArray[np.int64]


class Placement:
    """Row i of the batch is row ``rows[i]`` of part ``which[i]`` (parts of `sizes` rows)."""

    def __init__(self, which: I64, rows: I64, sizes: Sequence[int]):
        self.which, self.rows = which, rows
        self.starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        self._spans: list[tuple[I64, I64]] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def spans(self) -> list[tuple[I64, I64]]:
        """Per part: (the batch positions it fills, in order; its rows that fill them)."""
        if self._spans is None:
            order = stable_order(self.which)
            bounds = np.searchsorted(self.which[order], np.arange(len(self.starts) + 1))
            self._spans = [
                (order[a:b], self.rows[order[a:b]]) for a, b in itertools.pairwise(bounds)
            ]
        return self._spans

    def apply(self, parts: Sequence[Any]) -> Any:
        """One column of the batch from its parts (one per part, in order): numpy arrays
        (rows of any shape; dtypes joined as numpy joins them) give a fresh numpy array, one
        copy a part into its places; Arrow arrays of one type give an Arrow array, one take
        across the parts as one chunked array (no join first)."""
        if all(isinstance(p, np.ndarray) for p in parts):
            if len(parts) == 1:
                return parts[0].take(self.rows, axis=0)
            out = np.empty((len(self), *parts[0].shape[1:]), dtype=np.result_type(*parts))
            for p, (places, rows) in zip(parts, self.spans()):
                if places.size:
                    # (~10% less than p[rows] for rows of lists; the method, as np.take
                    # adds ~1 us a call, which small columns of records feel)
                    out[places] = p.take(rows, axis=0)
            return out
        flat = self.starts[self.which] + self.rows
        return pa.chunked_array(parts, type=parts[0].type).take(indices(flat)).combine_chunks()
