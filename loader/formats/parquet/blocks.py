"""The block side of `ParquetFormat` (and of the Arrow IPC reader, which extends it): a
read group's decoded tables joined into a `Block`, checked, gathered across blocks in a
batch's order, cut into parts, and made into records or batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import get_worker_info

from ...columns.batching import column_to_batch
from ...columns.gather import Block, gather, padded
from ...columns.kinds import LENGTHS, Kind, check_length
from ...shard import Shard
from .fetch import packed

__all__ = ["Blocks"]


class Blocks:
    """Blocks of a format whose `kinds` (batch mode) say what each column becomes; `_fixed`
    names the plain list columns of one row length, `_lengths` the length first read."""

    kinds: dict[str, Kind] | None
    _fixed: list[str]
    _lengths: dict[str, int]

    def check(self, joined: Block, shard: Shard) -> None:
        """Called in reading order as each group is first needed: a plain list column's
        rows must have the length the first group read had (ShardError naming the shard)."""
        for name in self._fixed:
            lo_hi = joined.lengths.get(name)
            if lo_hi is not None:
                check_length(name, shard.url, *lo_hi, self._lengths)

    def join(self, parts: Sequence[pa.Table]) -> Block:
        """The parts as one Block (numeric columns as views of the decoded buffers).
        Arrow's free memory is not handed back to the OS here: the next groups decode into
        it (handing it back every 4 MB made every decode touch fresh pages: 35,000 page
        faults a pass of 131,072 records, ~25% of the reader's CPU, and a higher peak RSS)."""
        return Block(parts, self.kinds, self._fixed)

    def release(self, joined: Block) -> None:
        joined.release()

    def nbytes(self, joined: Block) -> int:
        return joined.nbytes

    def take(self, joined: Block, indices: Any) -> dict[str, Any]:
        return joined.take(np.asarray(indices, dtype=np.int64))

    def gather(self, joined: Sequence[Block], which: Any, rows: Any) -> dict[str, Any]:
        """Row rows[k] of joined[which[k]] for each k, in order (padding is left to `cut`)."""
        return gather(joined, np.asarray(which, dtype=np.int64), np.asarray(rows, dtype=np.int64))

    def cut(self, taken: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
        """Rows [lo, hi) of what `gather` gave; padded list columns padded to their longest,
        each with its rows' lengths as ``<column>__len`` (int64), so a model can tell
        padding from data (``mask = arange(width) < lengths[:, None]``)."""
        pads = {} if self.kinds is None else {k: v.pad for k, v in self.kinds.items() if v.ragged}
        out: dict[str, Any] = {}
        for k, v in taken.items():
            if pads.get(k) is None:
                out[k] = v[lo:hi]
            else:  # padded rows, and their lengths beside them
                out[k], out[k + LENGTHS] = padded(v[lo:hi], pads[k])
        return out

    def records(self, taken: dict[str, Any]) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
        return Block.records(taken)

    def batch(self, taken: dict[str, Any]) -> dict[str, Any]:
        """numpy numbers -> tensors (fresh arrays: no copy; in a DataLoader worker packed
        into one storage, see `packed`); numpy Python objects (strings) -> lists; Arrow
        columns -> lists (with kinds), else as `column_to_batch` says."""
        arrays = {
            k: c for k, c in taken.items() if isinstance(c, np.ndarray) and not c.dtype.hasobject
        }
        tensors = (
            packed(arrays)
            if len(arrays) > 1 and get_worker_info() is not None
            else {k: torch.from_numpy(c) for k, c in arrays.items()}
        )
        return {
            k: tensors[k]
            if k in tensors
            else c.tolist()  # strings held as Python objects (loader.columns.gather)
            if isinstance(c, np.ndarray)
            else c.to_pylist()
            if self.kinds is not None
            else column_to_batch(c)
            for k, c in taken.items()
        }
