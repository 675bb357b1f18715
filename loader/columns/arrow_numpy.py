"""numpy <-> Arrow without pyarrow's pandas shim.

`pa.Array.to_numpy`, `np.asarray(arr)` and `pa.array(ndarray)` look pandas up on their
first call in a process; with pandas installed that import costs ~0.35 s, and the first
batch waited for it (measured: the first group's decode 0.28 s, of which the import was
nearly all). These build the same zero-copy views from the Arrow buffers directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["indices", "numpy_of"]

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
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])
