"""Read groups of Parquet rows as columns that batches are gathered from.

A group's numeric columns (and list columns of one fixed row length) are kept as numpy
views of the decoded Arrow buffers (no copy); other columns (strings, nulls, ragged lists)
as one Arrow array per group. A batch's records come from several groups at once (one per
interleaved piece): each numeric column of a batch is one fresh array filled by one
fancy-indexed copy per group (the records of each group found by one stable argsort), so
a kept batch pins no group; each Arrow column is one `take` over the groups' arrays as one
chunked array.

Measured (8 groups of 1,024 rows of 256 int32, 1,024-row batches): the copy per group costs
~90 ns a record; copying each group into a shared arena first (the previous design) cost
as much again and touched fresh pages on every pass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_numpy import indices, numpy_of
from .batching import numpy_view
from .kinds import LENGTHS, Kind, tensor_view
from .placement import Placement

__all__ = ["Block", "Selection", "gather", "padded", "record_maker"]

OBJECT_BYTES = 57  # a value held as a Python object, beyond its Arrow bytes: a str's
# header (sys.getsizeof("") is 49) and its pointer in the numpy array


def _view(chunk: pa.Array, kind: Kind | None, length: int | None) -> np.ndarray | None:
    """A zero-copy numpy view of a chunk: as its kind says (batch mode, data checked by
    loader.columns.kinds.check_part; a plain list column whose rows were all measured
    `length` long, as rows of that length), else wherever numpy_view can."""
    if kind is not None and kind.ragged and length is not None:
        return tensor_view(chunk, (length,), 1)
    if kind is None or kind.ragged:
        return numpy_view(chunk)
    return tensor_view(chunk, kind.shape or (), kind.levels)


def _numeric(
    chunks: list[pa.Array], kind: Kind | None, length: int | None = None
) -> np.ndarray | None:
    """The chunks as one numpy array (a view for one chunk, else one copy); None when a
    chunk is not viewable as numpy or the row shapes differ."""
    maybe = [_view(c, kind, length) for c in chunks]
    views = [v for v in maybe if v is not None]
    if not views or len(views) < len(maybe):
        return None
    first = views[0]
    if any(v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in views):
        return None
    return first if len(views) == 1 else np.concatenate(views)


def padded(arr: pa.Array, value: Any) -> tuple[np.ndarray, np.ndarray]:
    """(n, longest) numpy array of a list array's rows, shorter rows padded with `value`,
    and the (n,) int64 row lengths (a batch holds them as ``<column>__len``)."""
    lengths = numpy_of(pc.list_value_length(arr)).astype(np.int64)
    flat = numpy_of(arr.flatten())
    out = np.full((len(arr), int(lengths.max(initial=0))), value, dtype=flat.dtype)
    # (total,) column of each value inside its row
    within = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(np.arange(len(arr)), lengths), within] = flat
    return out, lengths


class Block:
    """The parts (Arrow tables) of one read group; row i of the block is row i of the parts
    laid end to end.

    With `kinds` (batch mode), each column is what its kind says (loader.columns.kinds): tensor
    columns are numpy views, list columns stay Arrow (strings and bytes of a torch batch:
    numpy arrays of the Python objects), and plain list columns with a pad value are
    padded per take. Without (record mode), numbers are numpy where Arrow
    allows, and other columns numpy arrays of the Python objects Arrow's `to_pylist`
    gives."""

    def __init__(
        self,
        parts: Sequence[pa.Table],
        kinds: Mapping[str, Kind] | None = None,
        measure: Sequence[str] = (),
    ) -> None:
        self.names: list[str] = parts[0].column_names if parts else []
        self.types = types = {name: parts[0].schema.field(name).type for name in self.names}
        self.rows = sum(p.num_rows for p in parts)
        # the list columns `measure` names: (shortest, longest) row
        self.lengths: dict[str, tuple[int, int]] = {}
        for name in measure:
            lo_hi = _length_range([c for p in parts for c in p.column(name).chunks])
            if lo_hi is not None:
                self.lengths[name] = lo_hi
        self.columns: dict[str, pa.Array] = {}  # the columns kept as Arrow
        self.arrays: dict[str, np.ndarray] = {}  # numeric: views of the Arrow buffers
        self._pads: dict[str, Any] = {}
        self._object_bytes = 0  # bytes of the columns held as Python objects
        self._kept: Block | None = None  # the copy Selections hold (`kept`)
        for name in self.names:
            chunks = [c for p in parts for c in p.column(name).chunks]
            kind = None if kinds is None else kinds.get(name)
            if kind is not None and kind.ragged and kind.pad is not None:
                self._pads[name] = kind.pad
            lo, hi = self.lengths.get(name, (None, None))  # (measured: no lengths to find)
            array = (
                _numeric(chunks, None)  # numpy where the group allows, else Arrow
                if kind is not None and kind.arrow
                else None
                if kind is not None and (not kind.tensor or name in self._pads)
                else _numeric(chunks, kind, lo if lo == hi else None)
            )
            if array is None and (kinds is None or _as_objects(kind, types[name])):
                # record mode, and strings of a torch batch (its lists): the column as
                # Python objects, made once a group by Arrow's to_pylist (as the raw loop
                # makes them a batch), then picked per record by numpy like numbers:
                # measured 0.07 s a pass of 131,072 500-byte strings for Arrow's take
                # across the groups, ~0.01 s this way (Arrow's take joins the chunks of
                # strings first: a mixture's slab spans 20-30 groups, 0.5-1.5 ms a take)
                col = pa.chunked_array(chunks, type=types[name])
                self._object_bytes += col.nbytes + OBJECT_BYTES * len(col)
                array = np.fromiter(python_values(col, name), dtype=object, count=len(col))
            if array is not None:
                self.arrays[name] = array
            else:
                col = pa.chunked_array(chunks, type=types[name])
                if _has_temporal(col.type) and not (kind and kind.arrow):  # a torch batch
                    # makes them Python objects: checked now
                    python_values(col, name)
                self.columns[name] = col.combine_chunks()

    def column(self, name: str) -> np.ndarray | pa.Array:
        """The whole column: a numpy array or its Arrow array."""
        if name in self.arrays:
            return self.arrays[name]
        return self.columns[name]

    @property
    def nbytes(self) -> int:
        """Bytes the block holds: its numeric and Arrow columns."""
        numeric = sum(a.nbytes for a in self.arrays.values() if a.dtype != object)
        arrow = sum(c.nbytes for c in self.columns.values())
        return int(numeric + arrow + self._object_bytes)

    def release(self) -> None:
        """The block is done: its columns are dropped (taken rows are copies; a Selection
        holds its own reference to them)."""
        self.arrays, self.columns, self._kept = {}, {}, None

    def kept(self) -> Block:
        """A copy of the block sharing its columns, which `release` leaves intact: the same
        one for every Selection of the block, so a gather of several Selections finds each
        block once (a part a copy was 22 parts a gather of the bench's mixture, not 16)."""
        if self._kept is None:
            self._kept = copy.copy(self)
        return self._kept

    def take(self, rows: npt.NDArray[np.int64], pad: bool = True) -> dict[str, Any]:
        """Rows of the block, in order: column -> a fresh numpy array or Arrow array (pad
        columns padded to their longest row unless `pad` is False)."""
        out: dict[str, Any] = {}
        arrow_rows = None
        for name in self.names:
            if name in self.arrays:
                out[name] = np.take(self.arrays[name], rows, axis=0)
                continue
            arrow_rows = indices(rows) if arrow_rows is None else arrow_rows
            out[name] = self.columns[name].take(arrow_rows)
            if pad and name in self._pads:
                out[name], out[name + LENGTHS] = padded(out[name], self._pads[name])
        return out

    @staticmethod
    def records(
        columns: dict[str, Any], step: int = 256
    ) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Taken columns as {column: value} rows, as Arrow's to_pylist gives them.

        Scalar columns only: a list, each column converted in one call and the rows built by
        a dict display made for these names (measured: 160 ns a record of 3 small columns,
        against 230 for Arrow's to_pylist and 360 for dict(zip(...))). With 2-D columns
        (fixed-length lists), a generator: their rows become lists one record at a time, so
        the lists a consumer drops die young: made in bulk, they outlive several garbage
        collections, each of which walks every one of them (measured: bulk 1024 rows 245 ms,
        this 170 ms per 80,000 records of 128 ints, torch imported).
        """
        names = list(columns)
        nested = [k for k, c in columns.items() if isinstance(c, np.ndarray) and c.ndim > 1]
        if not nested:
            values = [
                c.tolist() if isinstance(c, np.ndarray) else c.to_pylist() for c in columns.values()
            ]
            return record_maker(tuple(names))(values) if names else []
        return _nested_records(columns, nested, step)


@lru_cache(maxsize=64)
def record_maker(names: tuple[str, ...]) -> Callable[[list[list[Any]]], list[dict[str, Any]]]:
    """A function from column value lists to the list of row dicts, built as one list
    comprehension over a dict display with these keys (the fastest way CPython builds many
    small dicts). Keys are embedded with repr(), so any column name is safe."""
    args = ", ".join(f"v{i}" for i in range(len(names)))
    display = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    comma = "," if len(names) == 1 else ""
    code = f"lambda cols: [{{{display}}} for {args}{comma} in zip(*cols)]"
    made: Callable[[list[list[Any]]], list[dict[str, Any]]] = eval(code, {"zip": zip})
    return made


def _nested_records(
    columns: dict[str, Any], nested: list[str], step: int
) -> Iterator[dict[str, Any]]:
    names = list(columns)
    n = len(next(iter(columns.values())))
    for lo in range(0, n, step):
        values = [
            c[lo : lo + step]
            if name in nested
            else c[lo : lo + step].tolist()
            if isinstance(c, np.ndarray)
            else c.slice(lo, step).to_pylist()
            for name, c in columns.items()
        ]
        for row in zip(*values):
            record = dict(zip(names, row))
            for name in nested:
                record[name] = record[name].tolist()
            yield record


def _as_arrow(col: np.ndarray | pa.Array, like: pa.DataType) -> pa.Array:
    """A block's column as Arrow of type `like` (a block holds a column as numpy where its
    values allowed it; another block of the same column may not have)."""
    if not isinstance(col, np.ndarray):
        return col
    return pa.array(col.tolist() if col.ndim > 1 else col, type=like)


class Selection:
    """Row rows[k] of blocks[which[k]] for each k, not copied yet: a mixture's stream part,
    gathered with the other streams' parts into its batch by one `gather` (one copy where
    a gather of each stream's part, then the batch's placement of them, made two). It keeps
    the blocks' columns when their reading lets the groups go (`Block.release` drops the
    block's own references, not these)."""

    def __init__(self, blocks: Sequence[Block], which: Any, rows: Any) -> None:
        self.blocks = [b.kept() for b in blocks]
        self.which, self.rows = which, rows

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, at: int, n: int) -> Selection:
        """Rows [at, at + n) of the selection."""
        out = copy.copy(self)
        out.which, out.rows = self.which[at : at + n], self.rows[at : at + n]
        return out


class ConversionError(ValueError):
    """Row `row` of column `column` (counted from the block's first row) holds a value
    Python cannot represent (a date beyond year 9999, ...); the reader names the shard."""

    def __init__(self, column: str, row: int, cause: BaseException) -> None:
        super().__init__(f"column {column!r}, row {row}: {type(cause).__name__}: {cause}")
        self.column, self.row, self.cause = column, row, cause


def python_values(col: pa.ChunkedArray, name: str) -> list[Any]:
    """The column's values as Python objects (Arrow's to_pylist); ConversionError naming
    the column and the first row that cannot be converted (pyarrow's own error names
    neither)."""
    try:
        out: list[Any] = col.to_pylist()
        return out
    except (OverflowError, ValueError, pa.ArrowException) as e:
        row = next((i for i in range(len(col)) if not _converts(col, i)), 0)
        raise ConversionError(name, row, e) from e


def _converts(col: pa.ChunkedArray, i: int) -> bool:
    try:
        col[i].as_py()
        return True
    except (OverflowError, ValueError, pa.ArrowException):
        return False


def _as_objects(kind: Kind | None, t: pa.DataType) -> bool:
    """Whether a batch column of this kind and type is held as Python objects: a torch
    batch's list column of strings or bytes (its values become Python objects anyway)."""
    plain = kind is not None and not (kind.tensor or kind.arrow) and kind.gathers
    return plain and (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def _has_temporal(t: pa.DataType) -> bool:
    """Dates and timestamps, at any depth: the values whose conversion to Python can fail
    (beyond datetime's years 1-9999)."""
    if pa.types.is_temporal(t):
        return True
    if isinstance(t, pa.BaseExtensionType):
        return _has_temporal(t.storage_type)
    if pa.types.is_struct(t):
        return any(_has_temporal(f.type) for f in t)
    if pa.types.is_map(t):
        return _has_temporal(t.key_type) or _has_temporal(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_temporal(t.value_type)
    return False


def _length_range(chunks: list[pa.Array]) -> tuple[int, int] | None:
    """(shortest, longest) row of list chunks, from their offsets (None when empty)."""
    lo, hi = None, None
    for c in chunks:
        if not len(c):
            continue
        if pa.types.is_fixed_size_list(c.type):
            a = b = c.type.list_size
            lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
            continue
        offsets = numpy_of(c.offsets)
        lengths = offsets[1:] - offsets[:-1]  # (np.diff: 5 us more a group)
        a, b = int(lengths.min()), int(lengths.max())
        lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
    return None if lo is None or hi is None else (lo, hi)


def gather(
    blocks: Sequence[Block], which: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Row rows[k] of blocks[which[k]], for each k in order: column -> a fresh numpy array
    (where every block holds the column as numpy of one dtype and row shape: one copy a
    block into the batch's places of its records) or Arrow array (one take from the
    blocks' arrays as one chunked array: pyarrow takes across chunks without joining them,
    40 us for 2,048 strings from 8 groups, against 370 for a take per group put back in
    order). Every column is placed by one `Placement`. Pad columns stay unpadded Arrow
    lists (see `padded`)."""
    if not blocks:
        return {}
    if len(blocks) == 1:
        return blocks[0].take(rows, pad=False)
    place = Placement(which, rows, [b.rows for b in blocks])
    out: dict[str, Any] = {}
    for name in blocks[0].names:
        arrays = [b.arrays.get(name) for b in blocks]
        first = arrays[0]
        if first is not None and all(
            a is not None and a.dtype == first.dtype and a.shape[1:] == first.shape[1:]
            for a in arrays
        ):
            out[name] = place.apply(arrays)
            continue
        like = blocks[0].types[name]
        out[name] = place.apply([_as_arrow(b.column(name), like) for b in blocks])
    return out
