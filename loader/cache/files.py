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
    "claim",
    "dead_claim",
    "file_bytes",
    "read_block",
    "shard_key",
    "write_block",
]

CLAIM_WAIT = 30.0  # seconds a claim is honoured; an older one is a dead process's
PIECE = 1 << 16  # bytes each checksum covers: a read checks only the pieces it reads
_TRAILER = struct.Struct("<4sIQ")
_MAGIC = b"SSC1"
NAME = re.compile(r"^([0-9a-f]{32})-(\d+)-(\d+)\.blk$")
TEMP = re.compile(r"^[0-9a-f]{32}-\d+-\d+\.blk\.\d+\.\d+\.tmp$")


def shard_key(url: str, version: str | None) -> str:
    """32 hex digits naming (url, version): the prefix of every block file of the shard."""
    return hashlib.sha256(f"{url}\0{version}".encode()).hexdigest()[:32]


def file_bytes(size: int) -> int:
    """Bytes on disk of a block of `size` data bytes."""
    return size + 4 * -(-size // PIECE) + _TRAILER.size


def read_block(path: Path, x: int, y: int | None) -> tuple[bytes | None, str | None]:
    """(bytes [x, y) of the block file at `path` (y None: its end), None) if it is there
    and intact in what is read (size, trailer, the CRCs of the pieces read); (None, None)
    if there is no such file; (None, what is wrong) if it is damaged."""
    m = NAME.match(path.name)
    assert m is not None
    n = int(m.group(3)) - int(m.group(2))
    y = n if y is None else y
    crcs = -(-n // PIECE)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != file_bytes(n):
                return None, f"{size} bytes, expected {file_bytes(n)}"
            f.seek(n)
            tail = f.read()
            magic, count, length = _TRAILER.unpack_from(tail, 4 * crcs)
            if magic != _MAGIC or count != crcs or length != n:
                return None, "its trailer is not the cache's"
            # the bytes asked for, read as they are returned (no copy to cut them out of
            # the pieces read), and the rest of the pieces they begin and end in: each
            # piece's CRC runs over its three parts in order (zlib.crc32 continues a CRC)
            p0, p1 = x // PIECE, -(-y // PIECE)
            f.seek(p0 * PIECE)
            head = f.read(x - p0 * PIECE)
            data = f.read(y - x)
            rest = f.read(min(n, p1 * PIECE) - y)
    except FileNotFoundError:
        return None, None
    want = struct.unpack_from(f"<{p1 - p0}I", tail, 4 * p0)
    view = memoryview(data)
    for k, crc in enumerate(want):
        lo, hi = (p0 + k) * PIECE - x, (p0 + k + 1) * PIECE - x  # the piece, in `data`
        got = zlib.crc32(head) if k == 0 else 0
        got = zlib.crc32(view[max(0, lo) : hi], got)
        if k == len(want) - 1:
            got = zlib.crc32(rest, got)
        if got != crc:
            return None, f"the checksum of bytes [{(p0 + k) * PIECE}, ...) fails"
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
