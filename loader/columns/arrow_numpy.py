"""numpy <-> Arrow without pyarrow's pandas shim.

`pa.Array.to_numpy`, `np.asarray(arr)` and `pa.array(ndarray)` look pandas up on their
first call in a process; with pandas installed that import costs ~0.35 s, and the first
batch waited for it (measured: the first group's decode 0.28 s, of which the import was
nearly all). These build the same zero-copy views from the Arrow buffers directly, and
the few arrays the index is made of from numpy and Python strings (`pa.array` and
`pa.scalar` look pandas up too: 0.15 s of a 16-shard dataset's construction, measured).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["arrow_of", "arrow_values", "indices", "numpy_of", "string_scalar", "strings"]

_DTYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def numpy_of(arr: pa.Array) -> np.ndarray:
    """A null-free Arrow array of numbers as numpy: a read-only view of its data buffer
    for fixed-width numbers (offset and slicing respected), an unpacked copy for booleans
    (bit-packed in Arrow). Other types: pyarrow's own `to_numpy`."""
    dtype = _DTYPES.get(arr.type)
    if dtype is None:
        return np.asarray(arr.to_numpy(zero_copy_only=not pa.types.is_boolean(arr.type)))
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.empty(0, dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * itemsize)


def indices(rows: npt.NDArray[Any]) -> pa.Array:
    """An int64 numpy array as an Arrow array for `take` (a view, no copy when the array is
    contiguous int64)."""
    return arrow_of(np.ascontiguousarray(rows, dtype=np.int64))


_ARROW = {np.dtype(v): k for k, v in _DTYPES.items()}


def arrow_of(values: npt.ArrayLike, mask: npt.NDArray[np.bool_] | None = None) -> pa.Array:
    """A 1-d numpy array of fixed-width numbers as an Arrow array of the same type (a view
    of a contiguous array); `mask` marks nulls (True: null). Other dtypes: `pa.array`."""
    arr = np.ascontiguousarray(values)
    if arr.dtype == np.bool_ and arr.ndim == 1:
        bits = pa.py_buffer(np.packbits(arr, bitorder="little"))
        return pa.Array.from_buffers(pa.bool_(), len(arr), [_validity(mask), bits])
    kind = _ARROW.get(arr.dtype)
    if kind is None or arr.ndim != 1:
        return pa.array(arr, mask=mask)
    return pa.Array.from_buffers(kind, len(arr), [_validity(mask), pa.py_buffer(arr)])


def arrow_values(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    """Python values (None: null) as an Arrow array of `kind`: numbers, strings, lists of
    those (nested too) and dictionaries of strings built from numpy buffers; any other
    type by `pa.array`."""
    n = len(values)
    nulls = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    if pa.types.is_list(kind):
        lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        child = arrow_values([x for v in values if v is not None for x in v], kind.value_type)
        return pa.Array.from_buffers(
            kind, n, [_validity(nulls), pa.py_buffer(offsets)], children=[child]
        )
    if kind == pa.string():
        return strings(values)
    if pa.types.is_dictionary(kind) and kind.value_type == pa.string():
        return strings(values).dictionary_encode().cast(kind)
    dtype = _DTYPES.get(kind)
    if dtype is None:
        return pa.array(list(values), type=kind)
    numbers = np.fromiter((0 if v is None else v for v in values), dtype=dtype, count=n)
    return arrow_of(numbers, mask=nulls)


def strings(values: Sequence[str | None]) -> pa.Array:
    """Python strings (None: null) as an Arrow `string` array, built from one joined
    buffer and its offsets."""
    n = len(values)
    data = [b"" if v is None else v.encode() for v in values]
    lengths = np.fromiter(map(len, data), dtype=np.int64, count=n)
    if int(lengths.sum()) >= 2**31 - 1:  # past what `string` offsets hold: pyarrow's own
        return pa.array(list(values), pa.string())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    nulls = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    return pa.StringArray.from_buffers(
        n,
        pa.py_buffer(offsets),
        pa.py_buffer(b"".join(data)),
        _validity(nulls if nulls.any() else None),
    )


def string_scalar(value: str | None) -> pa.Scalar:
    """An Arrow string scalar, for compute functions (a Python str argument is converted
    by `pa.scalar`, which looks pandas up)."""
    return strings([value])[0]


def _validity(nulls: npt.NDArray[np.bool_] | None) -> pa.Buffer | None:
    """Arrow's validity bitmap (1: valid, least significant bit first) of a null mask."""
    if nulls is None or not np.any(nulls):
        return None
    return pa.py_buffer(np.packbits(~np.asarray(nulls, dtype=np.bool_), bitorder="little"))
