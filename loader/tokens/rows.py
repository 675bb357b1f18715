"""Documents as numpy, for the packer: a format that hands the reader's parts over as one
token array and the documents' lengths, gathered from the read groups by memory copies.

The reader gathers each part's documents from several read groups in the reading order
(loader.read). For other columns the Parquet format does that with Arrow's `take`; on a
list column Arrow's take costs 6-7 ns a token (measured on pyarrow 26: list rows are
rebuilt one by one, and a chunked array is joined first), several times what packing
itself costs. Here a group's token column is kept as its flat values and offsets, and a
part is gathered with one slice copy a document (documents are long: hundreds of tokens)
or, for short ones, one numpy fancy index. Everything else is the wrapped format's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TokenBlock", "TokenFormat", "TokenRows"]

I64 = npt.NDArray[np.int64]
LONG = 64  # mean tokens a document from which a slice copy each beats a fancy index


@dataclass(frozen=True)
class TokenRows:
    """Documents in order: their tokens end to end, each one's length, and how many null
    tokens the groups they came from hold (an error for the packer)."""

    values: npt.NDArray[Any]
    lengths: I64
    null_tokens: int = 0

    def __len__(self) -> int:
        return int(self.lengths.size)


class TokenBlock:
    """One read group's token column: flat values and per-row offsets (null rows empty)."""

    def __init__(self, parts: Sequence[pa.Table], column: str) -> None:
        chunks = [c for p in parts for c in p.column(column).chunks]
        arr = pa.chunked_array(chunks, type=parts[0].schema.field(column).type).combine_chunks()
        if arr.null_count:
            arr = pc.fill_null(arr, pa.scalar([], type=arr.type))
        if isinstance(arr, pa.FixedSizeListArray):
            size = arr.type.list_size
            self.offsets: I64 = np.arange(len(arr) + 1, dtype=np.int64) * size
        else:
            raw = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
            self.offsets = raw - raw[0]
        values = arr.flatten()
        self.null_tokens = values.null_count
        self.values: npt.NDArray[Any] = values.to_numpy(zero_copy_only=False)
        self.rows = len(arr)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)


def gather_rows(blocks: Sequence[TokenBlock], which: I64, rows: I64) -> TokenRows:
    """Row rows[k] of blocks[which[k]] for each k, in order."""
    n = rows.size
    starts = np.empty(n, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    for b, block in enumerate(blocks):
        at = np.flatnonzero(which == b) if len(blocks) > 1 else slice(None)
        r = rows[at]
        starts[at] = block.offsets[r]
        lengths[at] = block.offsets[r + 1] - block.offsets[r]
    dtype = np.result_type(*(b.values.dtype for b in blocks)) if blocks else np.int64
    out = np.empty(int(lengths.sum()), dtype=dtype)
    if out.size >= LONG * max(1, n):  # a view a document, copied by one C loop
        values = [b.values for b in blocks]
        ends = (starts + lengths).tolist()
        np.concatenate(
            [values[w][s:e] for w, s, e in zip(which.tolist(), starts.tolist(), ends)], out=out
        )
    else:
        # each token's source: its document's start in its group, plus its rank inside it
        dst = np.cumsum(lengths) - lengths
        inside = np.arange(out.size, dtype=np.int64) - np.repeat(dst, lengths)
        source = np.repeat(starts, lengths) + inside
        group = np.repeat(which, lengths)
        for b, block in enumerate(blocks):
            at = np.flatnonzero(group == b) if len(blocks) > 1 else slice(None)
            out[at] = block.values[source[at]]
    nulls = sum(blocks[int(b)].null_tokens for b in np.unique(which)) if n else 0
    return TokenRows(out, lengths, nulls)


class TokenFormat:
    """A shard format (Parquet, Arrow IPC) whose groups become `TokenBlock`s of `column`
    and whose parts are `TokenRows`; everything else is `inner`'s."""

    def __init__(self, inner: Any, column: str) -> None:
        self.inner = inner
        self.column = column

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "column"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def check(self, joined: TokenBlock, shard: Any) -> None:
        """Nothing to check in reading order: any list length packs."""

    def join(self, parts: Sequence[pa.Table]) -> TokenBlock:
        return TokenBlock(parts, self.column)

    def release(self, joined: TokenBlock) -> None:
        joined.values = joined.values[:0]

    def nbytes(self, joined: TokenBlock) -> int:
        return joined.nbytes

    def take(self, joined: TokenBlock, indices: Any) -> TokenRows:
        rows = np.asarray(indices, dtype=np.int64)
        return gather_rows([joined], np.zeros(rows.size, dtype=np.int64), rows)

    def gather(self, joined: Sequence[TokenBlock], which: Any, rows: Any) -> TokenRows:
        return gather_rows(
            joined, np.asarray(which, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        )

    def cut(self, taken: TokenRows, lo: int, hi: int) -> TokenRows:
        """Documents [lo, hi): a view of their tokens."""
        if lo == 0 and hi == len(taken):
            return taken
        before = int(taken.lengths[:lo].sum())
        size = int(taken.lengths[lo:hi].sum())
        return TokenRows(
            taken.values[before : before + size], taken.lengths[lo:hi], taken.null_tokens
        )
