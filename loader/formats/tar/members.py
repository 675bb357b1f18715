"""A tar shard's member table as arrays: what the tar reader looks up, without a Python
object per member.

Record r's members are rows ``first[r]:first[r + 1]``, each with its extension, the offset
of its data in the tar stream and its size. An index loaded from a saved Arrow file gives
these as views of its columns (no copy: a member table costs nothing until its shard is
read), a scan or a JSON index as Python lists (converted once). As a sequence it still
reads like the lists it replaces: ``members[r]`` is ``[[ext, offset, size], ...]``, so
sidecar writing and JSON saving work unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ...columns.arrays import flags, numbers

__all__ = ["Keys", "Members", "members_of"]

I64 = npt.NDArray[np.int64]


def _offsets(arr: pa.ListArray) -> I64:
    """(n+1,) where each list of a list array begins in its values, from 0."""
    got = numbers(arr.offsets)  # int32, this array's own (its slice's) n+1 entries
    return np.asarray(got - got[0], dtype=np.int64)


class Keys(Sequence[str]):
    """A shard's sample keys over an Arrow string array: slices are lists of str."""

    def __init__(self, values: pa.Array) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            got: list[str] = self.values.slice(start, max(0, stop - start)).to_pylist()
            return got[::step] if step != 1 else got
        return str(self.values[i].as_py())

    def __iter__(self) -> Iterator[str]:
        return iter(self.values.to_pylist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)


class Members(Sequence[list[list[Any]]]):
    """A tar shard's member table (see the module docstring)."""

    def __init__(self, first: I64, ext: pa.Array, offset: I64, size: I64) -> None:
        self.first = first  # (R+1,) each record's first member, then the member count
        self.ext = ext  # (M,) each member's extension (Arrow strings)
        self.offset = offset  # (M,) where its data begins in the tar stream
        self.size = size  # (M,) its size in bytes

    @classmethod
    def of_lists(cls, records: Sequence[Sequence[Sequence[Any]]]) -> Members:
        """From ``[[[ext, offset, size], ...] per record]`` (a scan's, a JSON index's)."""
        counts = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
        first = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        flat = [m for r in records for m in r]
        return cls(
            first,
            pa.array([m[0] for m in flat], pa.string()),
            np.array([m[1] for m in flat], dtype=np.int64),
            np.array([m[2] for m in flat], dtype=np.int64),
        )

    @classmethod
    def of_columns(cls, ext: pa.ListScalar, offset: pa.ListScalar, size: pa.ListScalar) -> Members:
        """From one shard's cells of the index table's member columns (zero-copy views)."""
        per_record = offset.values  # ListArray: per record, its members' offsets
        return cls(
            _offsets(per_record),
            ext.values.flatten(),
            np.asarray(numbers(per_record.flatten()), dtype=np.int64),
            np.asarray(numbers(size.values.flatten()), dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.first) - 1

    @overload
    def __getitem__(self, i: int) -> list[list[Any]]: ...

    @overload
    def __getitem__(self, i: slice) -> list[list[list[Any]]]: ...

    def __getitem__(self, i: int | slice) -> list[list[Any]] | list[list[list[Any]]]:
        if isinstance(i, slice):
            start, stop, _ = i.indices(len(self))
            return self.records(start, max(start, stop))
        n = len(self)
        r = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= r < n:
            raise IndexError(f"record {i} of {n}")
        return self.records(r, r + 1)[0]

    def records(self, start: int, stop: int) -> list[list[list[Any]]]:
        """Records [start, stop) as ``[[ext, offset, size], ...]`` lists."""
        if start >= stop:
            return []
        a, b = int(self.first[start]), int(self.first[stop])
        names = self.ext.slice(a, b - a).to_pylist()
        offs, sizes = self.offset[a:b].tolist(), self.size[a:b].tolist()
        cuts = (self.first[start : stop + 1] - a).tolist()
        return [
            [[names[k], offs[k], sizes[k]] for k in range(cuts[j], cuts[j + 1])]
            for j in range(stop - start)
        ]

    def __iter__(self) -> Iterator[list[list[Any]]]:
        return iter(self.records(0, len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def span(self, start: int, stop: int) -> tuple[int, int]:
        """(first data byte, one past the last) of records [start, stop)'s members."""
        a, b = int(self.first[start]), int(self.first[stop])
        return int(self.offset[a]), int((self.offset[a:b] + self.size[a:b]).max())

    def groups(self, limit: int) -> list[int]:
        """Records of each run of consecutive records holding `limit` bytes of member
        data or more (the last run: what is left), from the first: a run closes at the
        first record that brings it to `limit`. One search a run, not a step a record."""
        ends = np.cumsum(self.record_bytes())  # ends[i]: data of records 0..i
        n, out, start, base = len(ends), [], 0, 0
        while start < n:
            i = int(np.searchsorted(ends, base + limit, side="left"))
            if i >= n:
                out.append(n - start)
                break
            out.append(i + 1 - start)
            start, base = i + 1, int(ends[i])
        return out

    def record_bytes(self) -> I64:
        """(R,) each record's member data, in bytes."""
        sums = np.concatenate(([0], np.cumsum(self.size)))
        return np.asarray(sums[self.first[1:]] - sums[self.first[:-1]], dtype=np.int64)

    def data_bytes(self, start: int, stop: int, keep: Sequence[str] | None) -> int:
        """Member data of records [start, stop), only extensions in `keep` (None: all)."""
        a, b = int(self.first[start]), int(self.first[stop])
        sizes = self.size[a:b]
        if keep is None:
            return int(sizes.sum())
        mask = pc.is_in(self.ext.slice(a, b - a), value_set=pa.array(list(keep), pa.string()))
        return int(sizes[flags(mask)].sum()) if b > a else 0

    def extensions(self) -> set[str]:
        return set(pc.unique(self.ext).to_pylist())


def members_of(details: dict[str, Any]) -> Members:
    """A shard's ``details["members"]`` as a Members table: lists (a scan's, a JSON
    index's) are converted once and the table kept in `details` in their place."""
    value = details["members"]
    if not isinstance(value, Members):
        value = details["members"] = Members.of_lists(value)
    return value
