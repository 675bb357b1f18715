"""Read groups of Parquet rows as columns that batches are gathered from.

A group's numeric columns (and list columns of one fixed row length) are copied once,
sequentially, into a contiguous row range of an *arena*: one growable numpy buffer per
dtype and row shape, shared by all the groups a reader holds; other columns (strings,
nulls, ragged lists) become one Arrow array per group. The group's Arrow tables can then be
freed. A batch's records come from several groups at once (one per interleaved piece), and
since those groups' rows lie in one arena, each numeric column of a batch is one `np.take`
by arena row numbers into a fresh array the caller owns: a kept batch pins no group, and a
released group's rows are reused by the next.

Measured (8 groups of 4,000 rows, an int64 and a 128 x int32 column, 256-row batches): one
take from the arena costs 30 ns a record; a take per group with a scatter into the batch
164 ns. And after the first groups the arena needs no fresh pages (zeroing fresh pages was
~20% of a cold process's time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..batching import numpy_view
from ..kinds import Kind, tensor_view

__all__ = ["Arena", "Arenas", "Block", "gather", "padded", "record_maker"]


class Arena:
    """One growable numpy buffer of rows of one dtype and row shape. `put` copies arrays
    end to end into a free row range (first fit; the buffer doubles, keeping every row
    where it was, when none fits) and `free` gives the range back. Thread-safe: reader
    threads put while the consumer takes from `rows()`; puts copy concurrently, outside
    the lock (a growth waits for the copies under way)."""

    def __init__(self, dtype: np.dtype[Any], shape: tuple[int, ...], reserve: int = 0) -> None:
        self.dtype, self.shape = dtype, shape
        # `reserve` bytes of room from the start: untouched pages cost nothing, and rows are
        # taken from the bottom, so only the rows ever held get pages (first touches cost
        # ~2 ms a MB in a VM), and no growth copies them
        rows = reserve // max(1, self.row_bytes)
        self._data = np.empty((rows, *shape), dtype=dtype)
        self._free: list[tuple[int, int]] = [(0, rows)] if rows else []  # sorted, merged
        self._copying = 0  # puts copying into the buffer now
        self._cond = threading.Condition()

    @property
    def row_bytes(self) -> int:
        return int(self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64)))

    def rows(self) -> np.ndarray:
        """The buffer as it is now: every range whose `put` returned before this call lies
        in it (growing replaces the buffer before any later put writes; rows never move),
        so no lock is needed to read it."""
        return self._data

    def put(self, arrays: Sequence[np.ndarray]) -> int:
        """Copy `arrays` end to end into a free range; its first row."""
        n = sum(len(a) for a in arrays)
        with self._cond:
            at = self._take_range(n)
            out = self._data[at : at + n]
            self._copying += 1
        try:
            if len(arrays) == 1:
                out[...] = arrays[0]
            else:
                np.concatenate(arrays, out=out)
        finally:
            with self._cond:
                self._copying -= 1
                self._cond.notify_all()
        return at

    def free(self, at: int, n: int) -> None:
        """Rows [at, at + n) may be reused."""
        if n <= 0:
            return
        with self._cond:
            self._free.append((at, at + n))
            self._free.sort()
            merged = [self._free[0]]
            for a, b in self._free[1:]:
                if a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
                else:
                    merged.append((a, b))
            self._free = merged

    def _take_range(self, n: int) -> int:
        """First row of a free range of n rows (called holding the lock)."""
        for i, (a, b) in enumerate(self._free):
            if b - a >= n:
                self._free[i] = (a + n, b)
                if a + n == b:
                    del self._free[i]
                self.hwm = max(getattr(self, "hwm", 0), a + n)
                return a
        # grow: once no copy is under way, the old rows keep their place in a bigger buffer
        while self._copying:
            self._cond.wait()
        old = len(self._data)
        tail = self._free[-1][0] if self._free and self._free[-1][1] == old else old
        size = max(old + old // 2, tail + n, 1024)
        grown = np.empty((size, *self.shape), dtype=self.dtype)
        grown[:tail] = self._data[:tail]
        self._data = grown
        if self._free and self._free[-1][1] == old:
            self._free.pop()
        self._free.append((tail + n, size))
        return tail


class Arenas:
    """The arenas of one reader, by dtype and row shape; each new one starts with room for
    `reserve` bytes (what the reader expects to hold at most)."""

    def __init__(self, reserve: int = 0) -> None:
        self.reserve = reserve
        self._by: dict[tuple[np.dtype[Any], tuple[int, ...]], Arena] = {}
        self._lock = threading.Lock()

    def of(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Arena:
        with self._lock:
            if (dtype, shape) not in self._by:
                self._by[(dtype, shape)] = Arena(dtype, shape, self.reserve)
            return self._by[(dtype, shape)]


def _view(chunk: pa.Array, kind: Kind | None) -> np.ndarray | None:
    """A zero-copy numpy view of a chunk: as its kind says (batch mode, data checked by
    loader.kinds.check_part), else wherever numpy_view can."""
    if kind is None or kind.ragged:
        return numpy_view(chunk)
    return tensor_view(chunk, kind.shape or (), kind.levels)


def _to_arena(
    chunks: list[pa.Array], arenas: Arenas, kind: Kind | None = None
) -> tuple[Arena, int, int] | None:
    """(arena, first row, rows): the chunks copied end to end into an arena; None when a
    chunk is not viewable as numpy or the row shapes differ."""
    maybe = [_view(c, kind) for c in chunks]
    views = [v for v in maybe if v is not None]
    if not views or len(views) < len(maybe):
        return None
    first = views[0]
    if any(v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in views):
        return None
    arena = arenas.of(first.dtype, first.shape[1:])
    return arena, arena.put(views), sum(len(v) for v in views)


def padded(arr: pa.Array, value: Any) -> np.ndarray:
    """(n, longest) numpy array of a list array's rows, shorter rows padded with `value`."""
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    flat = np.asarray(arr.flatten().to_numpy(zero_copy_only=False))
    out = np.full((len(arr), int(lengths.max(initial=0))), value, dtype=flat.dtype)
    # (total,) column of each value inside its row
    within = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(np.arange(len(arr)), lengths), within] = flat
    return out


class Block:
    """The parts (Arrow tables) of one read group; row i of the block is row i of the parts
    laid end to end. The parts are not kept: columns are copied or combined on construction.

    With `kinds` (batch mode), each column is what its kind says (loader.kinds): tensor
    columns go to the arenas, list columns stay Arrow, and plain list columns with a pad
    value are padded per take. Without (record mode), numbers go to the arenas where Arrow
    allows."""

    def __init__(
        self,
        parts: Sequence[pa.Table],
        arenas: Arenas | None = None,
        kinds: Mapping[str, Kind] | None = None,
        measure: Sequence[str] = (),
    ) -> None:
        self.names: list[str] = parts[0].column_names if parts else []
        self.types = {name: parts[0].schema.field(name).type for name in self.names}
        self.rows = sum(p.num_rows for p in parts)
        # the list columns `measure` names: (shortest, longest) row
        self.lengths: dict[str, tuple[int, int]] = {}
        for name in measure:
            col = pa.chunked_array([c for p in parts for c in p.column(name).chunks])
            if len(col):
                lo, hi = pc.min_max(pc.list_value_length(col)).values()
                self.lengths[name] = (lo.as_py(), hi.as_py())
        self.columns: dict[str, pa.Array] = {}  # the columns not in an arena
        self.places: dict[str, tuple[Arena, int, int]] = {}  # numeric: (arena, at, rows)
        self._pads: dict[str, Any] = {}
        arenas = arenas if arenas is not None else Arenas()
        for name in self.names:
            chunks = [c for p in parts for c in p.column(name).chunks]
            kind = None if kinds is None else kinds.get(name)
            if kind is not None and kind.ragged and kind.pad is not None:
                self._pads[name] = kind.pad
            place = (
                None
                if kind is not None and (not kind.tensor or name in self._pads)
                else _to_arena(chunks, arenas, kind)
            )
            if place is not None:
                self.places[name] = place  # read through the arena: views would pin it
            else:
                col = pa.chunked_array(chunks, type=parts[0].schema.field(name).type)
                self.columns[name] = col.combine_chunks()

    def column(self, name: str) -> np.ndarray | pa.Array:
        """The whole column: a view of its arena rows (valid while the block is held) or
        its Arrow array."""
        if name in self.places:
            arena, at, n = self.places[name]
            return arena.rows()[at : at + n]
        return self.columns[name]

    @property
    def nbytes(self) -> int:
        """Bytes the block holds: its arena rows and Arrow columns."""
        numeric = sum(a.row_bytes * n for a, _, n in self.places.values())
        arrow = sum(c.nbytes for c in self.columns.values())
        return int(numeric + arrow)

    def release(self) -> None:
        """The block is done: its arena rows may be reused by the next blocks."""
        for arena, at, n in self.places.values():
            arena.free(at, n)
        self.places, self.columns = {}, {}

    def take(self, rows: npt.NDArray[np.int64], pad: bool = True) -> dict[str, Any]:
        """Rows of the block, in order: column -> a fresh numpy array or Arrow array (pad
        columns padded to their longest row unless `pad` is False)."""
        out: dict[str, Any] = {}
        arrow_rows = None
        for name in self.names:
            if name in self.places:
                arena, at, _ = self.places[name]
                out[name] = np.take(arena.rows(), rows + at, axis=0)
                continue
            arrow_rows = pa.array(rows) if arrow_rows is None else arrow_rows
            out[name] = self.columns[name].take(arrow_rows)
            if pad and name in self._pads:
                out[name] = padded(out[name], self._pads[name])
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


def gather(
    blocks: Sequence[Block], which: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Row rows[k] of blocks[which[k]], for each k in order: column -> a fresh numpy array
    (where every block holds the column in one arena: one take by arena row) or Arrow
    array (one take from the blocks' arrays as one chunked array: pyarrow takes across
    chunks without joining them, 40 us for 2,048 strings from 8 groups, against 370 for
    a take per group put back in order). Pad columns stay unpadded Arrow lists (see
    `padded`)."""
    if not blocks:
        return {}
    if len(blocks) == 1:
        return blocks[0].take(rows, pad=False)
    out: dict[str, Any] = {}
    starts: npt.NDArray[np.int64] | None = None
    for name in blocks[0].names:
        places = [b.places.get(name) for b in blocks]
        arena = places[0][0] if places[0] is not None else None
        if arena is not None and all(p is not None and p[0] is arena for p in places):
            # (B,) where each block's rows start in the arena; (n,) the arena rows
            ats = np.array([p[1] for p in places if p is not None], dtype=np.int64)
            out[name] = np.take(arena.rows(), ats[which] + rows, axis=0)
            continue
        if starts is None:  # (B,) where each block starts in the blocks laid end to end
            sizes = [b.rows for b in blocks]
            starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        like = blocks[0].types[name]
        chunks = pa.chunked_array([_as_arrow(b.column(name), like) for b in blocks], type=like)
        out[name] = chunks.take(pa.array(starts[which] + rows)).combine_chunks()
    return out
