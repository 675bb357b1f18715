"""The node cache's files (loader.cache.node): block files, their checks, and claims.

A block file is the block's bytes, then a CRC-32 of each 64 KiB piece, then a trailer
(magic, number of CRCs, data length). Its name is ``<32 hex digits of a hash of (url,
version)>-<first byte>-<end byte>.blk``: never a part of the URL. It is written under a
temporary name and renamed, so a reader sees a whole block or none. A claim
(``<block>.claim``, created exclusively, holding "host pid") says a process is fetching
the block; a claim of a process that is gone (or older than CLAIM_WAIT) is dead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import struct
import threading
import time
import zlib
from pathlib import Path

__all__ = [
    "CLAIM_WAIT",
    "NAME",
    "TEMP",
    "check_open",
    "claim",
    "dead_claim",
    "file_bytes",
    "forget",
    "read_block",
    "shard_key",
    "write_block",
]

CLAIM_WAIT = 30.0  # seconds a claim is honoured; an older one is a dead process's
PIECE = 1 << 16  # bytes each checksum covers: a read checks only the pieces it reads
AGED = 0.2  # seconds since its last change before a file's checks are remembered
KEPT = 1 << 16  # block files whose checks a process remembers (~200 bytes each)
_TRAILER = struct.Struct("<4sIQ")
_MAGIC = b"SSC1"
NAME = re.compile(r"^([0-9a-f]{32})-(\d+)-(\d+)\.blk$")
TEMP = re.compile(r"^[0-9a-f]{32}-\d+-\d+\.blk\.\d+\.\d+\.tmp$")


@functools.lru_cache(maxsize=4096)  # every cached read names its blocks by it
def shard_key(url: str, version: str | None) -> str:
    """32 hex digits naming (url, version): the prefix of every block file of the shard."""
    return hashlib.sha256(f"{url}\0{version}".encode()).hexdigest()[:32]


def file_bytes(size: int) -> int:
    """Bytes on disk of a block of `size` data bytes."""
    return size + 4 * -(-size // PIECE) + _TRAILER.size


def read_block(
    path: str | Path, x: int, y: int | None, touch: bool = False
) -> tuple[bytes | None, str | None]:
    """(bytes [x, y) of the block file at `path` (y None: its end), None) if it is there
    and intact in what is read; (None, None) if there is no such file; (None, what is
    wrong) if it is damaged. `touch`: set the file's modification time to now (LRU's
    recency), remembered as the process's own change.

    Every read checks the file's size. Its trailer and the CRC-32 of each 64 KiB piece read
    are checked the first time this process reads that piece of that file: the checks are
    remembered (`SEEN`) by the file's identity (device, inode, size, modification time),
    which a write in place changes; the cache itself never writes a block in place (a new
    file, renamed over). As git does for racy timestamps, a file modified less than AGED
    seconds before its check is not remembered (a write within the same tick of the
    filesystem's clock could keep its time) and is checked again at its next read.
    Measured: on cached epochs the CRCs took 40% of the reads through the cache."""
    path = os.fspath(path)  # (a str: pathlib's joins cost more than the read of a piece)
    m = NAME.match(os.path.basename(path))
    assert m is not None
    n = int(m.group(3)) - int(m.group(2))
    y = n if y is None else y
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    try:
        return _read(fd, path, n, x, y, touch)
    finally:
        os.close(fd)


def check_open(fd: int, path: str, n: int) -> str | None:
    """What is wrong with the block file open as `fd` (at `path`, of `n` data bytes), or
    None if it is intact: its size, trailer and every piece's CRC, as `read_block` checks
    them (the pieces this process checked of this very file are not read again)."""
    st = os.fstat(fd)
    seen = SEEN.get(path)
    if seen is not None and seen.stamp == _stamp(st) and seen.ok.find(0) < 0:
        return None
    return _read(fd, path, n, 0, n, False)[1]


class _Seen:
    """What this process has checked of one block file: its identity when checked, its
    pieces' CRCs (from its trailer) and which pieces passed."""

    __slots__ = ("crcs", "ok", "stamp")

    def __init__(self, stamp: tuple[int, ...], crcs: tuple[int, ...]) -> None:
        self.stamp, self.crcs, self.ok = stamp, crcs, bytearray(len(crcs))


SEEN: dict[str, _Seen] = {}  # block file path -> its checks (at most KEPT, oldest dropped)
_seen_lock = threading.Lock()


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember(key: str, seen: _Seen) -> None:
    with _seen_lock:
        SEEN.pop(key, None)
        SEEN[key] = seen
        while len(SEEN) > KEPT:
            del SEEN[next(iter(SEEN))]


def forget(path: Path) -> None:
    """Drop what this process remembers of checking the block file at `path` (deleted)."""
    with _seen_lock:
        SEEN.pop(str(path), None)


def _read(
    fd: int, key: str, n: int, x: int, y: int, touch: bool
) -> tuple[bytes | None, str | None]:
    st = os.fstat(fd)
    if st.st_size != file_bytes(n):
        return None, f"{st.st_size} bytes, expected {file_bytes(n)}"
    stamp, seen = _stamp(st), SEEN.get(key)
    if seen is None or seen.stamp != stamp:
        tail = os.pread(fd, st.st_size - n, n)
        crcs = -(-n // PIECE)
        magic, count, length = _TRAILER.unpack_from(tail, 4 * crcs)
        if magic != _MAGIC or count != crcs or length != n:
            return None, "its trailer is not the cache's"
        seen = _Seen(stamp, struct.unpack_from(f"<{crcs}I", tail))
        if time.time_ns() - st.st_mtime_ns > AGED * 1e9:
            _remember(key, seen)
    p0, p1 = x // PIECE, -(-y // PIECE)
    if seen.ok.find(0, p0, p1) < 0:  # every piece read was checked: the bytes only
        data = os.pread(fd, y - x, x)
        problem = None if len(data) == y - x else "it was cut while read"
    else:
        data, problem = _checked(fd, seen, n, x, y)
    if problem is None and touch:
        now = time.time_ns()
        with contextlib.suppress(OSError):
            os.utime(fd, ns=(now, now))
            if SEEN.get(key) is seen:  # our own change: the pieces checked still hold
                seen.stamp = (*stamp[:3], now)
    return (data, None) if problem is None else (None, problem)


def _checked(fd: int, seen: _Seen, n: int, x: int, y: int) -> tuple[bytes, str | None]:
    """Bytes [x, y) and the rest of the pieces they begin and end in, read as they are
    returned (no copy to cut them out of the pieces read), the pieces not checked yet
    checked: each piece's CRC runs over its three parts in order (zlib.crc32 continues a
    CRC)."""
    p0, p1 = x // PIECE, -(-y // PIECE)
    head = os.pread(fd, x - p0 * PIECE, p0 * PIECE)
    data = os.pread(fd, y - x, x)
    rest = os.pread(fd, min(n, p1 * PIECE) - y, y)
    if len(head) + len(data) + len(rest) != min(n, p1 * PIECE) - p0 * PIECE:
        return data, "it was cut while read"
    view = memoryview(data)
    for k in range(p0, p1):
        if seen.ok[k]:
            continue
        lo, hi = k * PIECE - x, (k + 1) * PIECE - x  # the piece, in `data`
        got = zlib.crc32(head) if k == p0 else 0
        got = zlib.crc32(view[max(0, lo) : hi], got)
        if k == p1 - 1:
            got = zlib.crc32(rest, got)
        if got != seen.crcs[k]:
            return data, f"the checksum of bytes [{k * PIECE}, ...) fails"
        seen.ok[k] = 1
    return data, None


def write_block(path: Path, data: bytes) -> None:
    """Write the block file atomically (a temporary name in its folder, then a rename);
    OSError if it cannot be written (the temporary file is removed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        view = memoryview(data)
        crcs = [zlib.crc32(view[at : at + PIECE]) for at in range(0, len(data), PIECE)]
        with open(tmp, "wb") as f:
            f.write(data)
            f.write(struct.pack(f"<{len(crcs)}I", *crcs))
            f.write(_TRAILER.pack(_MAGIC, len(crcs), len(data)))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def claim(path: Path) -> bool:
    """Whether this process now holds the claim file `path` (False: a live process does)."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if not dead_claim(path):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a dead process's claim
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}")
        return True
    return False


def dead_claim(claim: Path) -> bool:
    """Whether a claim was left by a process that is gone: one of this host no longer
    running, or any older than CLAIM_WAIT."""
    try:
        age = time.time() - claim.stat().st_mtime
        host, pid = claim.read_text().split()
    except (FileNotFoundError, ValueError):
        return False  # released, or being written
    if age > CLAIM_WAIT:
        return True
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False
