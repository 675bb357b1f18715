"""Where each row of a batch comes from, decided once and applied to every column.

A batch is gathered from several parts (a reader's decoded groups; a mixture's streams'
pieces): row i of the batch is row ``rows[i]`` of part ``which[i]``. Every column of the
batch, whatever it holds (numpy numbers, stacked lists, Python objects, Arrow strings and
lists, the mixture's stream labels), is placed by the one `Placement`, so a row of a batch
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

from .arrow_numpy import indices

__all__ = ["Placement"]

I64 = npt.NDArray[np.int64]


class Placement:
    """Row i of the batch is row ``rows[i]`` of part ``which[i]`` (parts of `sizes` rows);
    `ordered`: each part's rows are taken whole and in order (a mixture's pieces), so a
    numpy part is copied to its places as it is."""

    def __init__(self, which: I64, rows: I64, sizes: Sequence[int], ordered: bool = False):
        self.which, self.rows, self.ordered = which, rows, ordered
        self.starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        self._spans: list[tuple[I64, I64]] | None = None

    @classmethod
    def of_flat(cls, flat: I64, sizes: Sequence[int], ordered: bool = False) -> Placement:
        """Row i of the batch is row ``flat[i]`` of the parts laid end to end."""
        ends = np.cumsum(sizes)
        which = np.searchsorted(ends, flat, side="right").astype(np.int64)
        return cls(which, flat - (ends[which] - np.asarray(sizes)[which]), sizes, ordered)

    @classmethod
    def of_places(cls, places: Sequence[I64]) -> Placement:
        """Part i's rows, taken whole and in order, fill batch positions ``places[i]``
        (ascending); all parts' places together are each position once. (What `of_flat`
        gives for such parts, with the positions each part fills known, so nothing is
        sorted: a mixture's streams' pieces.)"""
        n = sum(len(p) for p in places)
        which = np.empty(n, dtype=np.int64)
        rows = np.empty(n, dtype=np.int64)
        spans = []
        for i, at in enumerate(places):
            within = np.arange(len(at), dtype=np.int64)
            which[at] = i
            rows[at] = within
            spans.append((at, within))
        out = cls(which, rows, [len(p) for p in places], ordered=True)
        out._spans = spans
        return out

    def __len__(self) -> int:
        return len(self.rows)

    def spans(self) -> list[tuple[I64, I64]]:
        """Per part: (the batch positions it fills, in order; its rows that fill them)."""
        if self._spans is None:
            order = np.argsort(self.which, kind="stable")
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
                return parts[0].copy() if self.ordered else np.take(parts[0], self.rows, axis=0)
            out = np.empty((len(self), *parts[0].shape[1:]), dtype=np.result_type(*parts))
            for p, (places, rows) in zip(parts, self.spans()):
                if places.size:
                    out[places] = p if self.ordered else p[rows]
            return out
        flat = self.starts[self.which] + self.rows
        return pa.chunked_array(parts, type=parts[0].type).take(indices(flat)).combine_chunks()
