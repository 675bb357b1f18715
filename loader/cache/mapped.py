"""A cached shard as one read-only memory map over its block files, for pyarrow to read as
it reads a local file (loader.formats.parquet.local): no Python call a read.

pyarrow's `memory_map` maps one file; a shard's cached bytes are many block files (1 MiB
each, loader.cache.files), so no library maps them as one range. Here an address range is
reserved (anonymous, no access) and each block file's data part is mapped over its place in
it (``MAP_FIXED``), by libc's ``mmap`` through ctypes. Only bytes whose every block is in
the folder are mapped (loader.cache.node.NodeCache.mapped: the bytes before the footer,
which pyarrow is given and does not read): the range has no hole, so no read can see bytes
that were never fetched (a hole would read as zeros in a sparse buffer). Each block is
checked before it is mapped, as every cached read is (its size, trailer and CRCs:
loader.cache.files.check_open), through the descriptor that is then mapped: the file mapped
is the one checked. The map is released when the last pyarrow buffer over it goes
(`pa.foreign_buffer`'s base). A block evicted meanwhile stays readable through the map (an
unlinked file lives while mapped; its disk space is freed when the map goes) and is what
was checked: the cache never writes a block in place.

Only on Linux and macOS (elsewhere `map_blocks` returns None and the cache is read through
its files).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Sequence

import pyarrow as pa

from .files import check_open

__all__ = ["map_blocks", "map_files"]

_MAP_FIXED = 0x10  # the same on Linux and macOS (the mmap module names neither)
_PROT_NONE = 0
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux") or sys.platform == "darwin":
    with contextlib.suppress(OSError, AttributeError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int64,
        ]
        _libc.munmap.restype = ctypes.c_int
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """An address range this process mapped; unmapped when it goes (the base of the
    buffers pyarrow makes over it)."""

    def __init__(self, address: int, length: int) -> None:
        self.address, self.length = address, length

    def __del__(self) -> None:
        if _libc is not None and self.length:
            _libc.munmap(self.address, self.length)
            self.length = 0


def _round(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


def map_blocks(fds: Sequence[int], sizes: Sequence[int], block: int) -> pa.Buffer | None:
    """One buffer over the data parts of the open block files `fds` (each `sizes[i]` data
    bytes, every one but the last exactly `block`), in order: the shard's bytes; None where
    this platform cannot map so, or a map fails (the caller reads through the files). The
    caller has checked the files open as `fds`: those are what is mapped."""
    total = sum(sizes)
    if _libc is None or total == 0 or block % mmap.PAGESIZE:
        return None
    length = _round(total)
    anon = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))
    base = _libc.mmap(None, length, _PROT_NONE, mmap.MAP_PRIVATE | anon, -1, 0)
    if base in (None, _FAILED):
        return None
    owner = _Mapping(base, length)
    at = 0
    for fd, n in zip(fds, sizes):
        want = base + at
        got = _libc.mmap(want, _round(n), mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if got != want:
            return None  # `owner` unmaps the range
        at += n
    return pa.foreign_buffer(base, total, base=owner)


def map_files(
    paths: Sequence[str], sizes: Sequence[int], block: int
) -> tuple[pa.Buffer | None, int | None, str | None]:
    """(`map_blocks` of the block files at `paths`, None, None) if each is intact (checked
    through the descriptor then mapped: `check_open`); (None, i, what is wrong) if
    `paths[i]` is damaged; (None, None, None) if one is gone or the map cannot be made."""
    fds: list[int] = []
    try:
        for i, (path, n) in enumerate(zip(paths, sizes)):
            try:
                fds.append(os.open(path, os.O_RDONLY))
            except FileNotFoundError:
                return None, None, None  # evicted since it was listed
            problem = check_open(fds[-1], path, n)
            if problem is not None:
                return None, i, problem
        return map_blocks(fds, sizes, block), None, None
    finally:
        for fd in fds:
            os.close(fd)  # a map keeps its file
