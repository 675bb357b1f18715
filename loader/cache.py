"""The node cache: remote shard bytes kept on local disk, shared by the ranks of one node.

A shard's bytes are cached in aligned blocks of BLOCK bytes (the last one shorter), each a
file named from a hash of (url, version) and the block's byte range, so no URL can name a
path and a rewritten shard (another version) never matches an old block. A read of bytes
[a, b) takes the blocks covering it from disk and fetches the missing ones (consecutive
ones in one request), whole: the reads of a node's ranks and epochs cut shards at
different rows, and aligned blocks are what they share.

fsspec's own caches (``filecache``, ``blockcache``) do not fit: they key by path, not by
the indexed version; they are per process (a node's ranks would each fetch and hold their
copy), bounded by LRU or not at all, and cannot check what they hand back. So:

- writes are atomic: a block goes to a temporary name, then is renamed, so a killed
  process leaves no half block (its temporary files are removed by the next scan);
- every block read from disk is checked (its size, its trailer, and the CRC-32 of each
  64 KiB piece read: a read of part of a block reads and checks that part); a damaged one
  is logged (WARNING), deleted and fetched again, never decoded;
- a block being fetched by one process is claimed (an exclusive ``.claim`` file); the
  node's other processes wait for it instead of fetching it too;
- the first cached read of a shard in a reading checks that the remote file is still the
  indexed version (one metadata request), so a shard rewritten on S3 raises
  StaleIndexError as an uncached read does, rather than being served from the old copy;
- with a `limit`, blocks are evicted by next use: the node's plans say when each shard is
  read next (`loader.cache_plan.NextUse`), the block needed furthest ahead goes first, and
  a block needed later than everything held is not cached (Belady's rule). ``policy="lru"``
  (least recently read first, for comparison) exists for the benchmark and tests.
- only files with the cache's own names are ever deleted, and only inside its folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from sampler.checks import parse_size

from .stats import current
from .storage import Indexed, check_version

__all__ = ["BLOCK", "NodeCache", "parse_size", "reading_shard"]

log = logging.getLogger(__name__)

BLOCK = 1 << 20  # bytes a cached block holds (the unit fetched, kept and evicted)
CLAIM_WAIT = 30.0  # seconds a claim is honoured; an older one is a dead process's
POLL = 0.01  # seconds between looks at a block another process is fetching
RESCAN = 1.0  # seconds the folder's listing is trusted for (the node's writes change it)
PIECE = 1 << 16  # bytes each checksum covers: a read checks only the pieces it reads
# after the data: a CRC-32 per piece, then the trailer: magic, number of CRCs, data length
_TRAILER = struct.Struct("<4sIQ")
_MAGIC = b"SSC1"
_NAME = re.compile(r"^([0-9a-f]{32})-(\d+)-(\d+)\.blk$")
_TEMP = re.compile(r"^[0-9a-f]{32}-\d+-\d+\.blk\.\d+\.\d+\.tmp$")

Fetch = Callable[[Sequence[str], Sequence[int], Sequence[int], Sequence[Indexed]], list[bytes]]


class Future(Protocol):
    """When the node reads each shard next (loader.cache_plan.NextUse)."""

    def shard_of(self, key: str) -> int | None: ...
    def next_use(self, shards: Sequence[int], after: bool = False) -> list[float]: ...
    def reached(self, shard: int) -> None: ...


def shard_key(url: str, version: str | None) -> str:
    """32 hex digits naming (url, version): the prefix of every block file of the shard."""
    return hashlib.sha256(f"{url}\0{version}".encode()).hexdigest()[:32]


def _dead_claim(claim: Path) -> bool:
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


_local = threading.local()


@contextlib.contextmanager
def reading_shard(cache: NodeCache | None, shard: int) -> Iterator[None]:
    """Reads of this thread inside the block go through `cache` (None: not cached), for
    shard `shard` (which the cache's plan knows)."""
    before = getattr(_local, "at", None)
    _local.at = None if cache is None else (cache, shard)
    try:
        yield
    finally:
        _local.at = before


def current_cache() -> tuple[NodeCache, int] | None:
    """(cache, shard) the calling thread reads through, if any (see `reading_shard`)."""
    at: tuple[NodeCache, int] | None = getattr(_local, "at", None)
    return at


class NodeCache:
    """Blocks of remote shards in `folder` (created if missing), at most `limit` bytes of
    them (None: no bound), evicted as `policy` says ("next-use": by `future`; "lru")."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        limit: int | None = None,
        future: Future | None = None,
        policy: str = "next-use",
    ) -> None:
        if policy not in ("next-use", "lru"):
            raise ValueError(f"policy must be 'next-use' or 'lru', got {policy!r}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit, self.future, self.policy = limit, future, policy
        self.block = BLOCK
        self._lock = threading.Lock()
        self._room = threading.Lock()
        self._pending: dict[str, int] = {}  # blocks being written (their room reserved)
        self._changed: dict[str, int | None] = {}  # written (bytes) or deleted (None) here
        self._held: dict[str, int] = {}  # block file name -> bytes on disk
        self._scanned = -float("inf")
        self._checked: set[str] = set()  # shards (url keys) checked against the remote

    # --- reading ---------------------------------------------------------------------

    def read(
        self,
        fs: Any,
        urls: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        indexed: Sequence[Indexed],
        fetch: Fetch,
        shard: int | None = None,
    ) -> list[bytes]:
        """Bytes [starts[i], ends[i]) of urls[i] (of the indexed (size, version)), from the
        cache where it holds them, the missing blocks fetched with `fetch` (the retrying
        ranged read) and kept. `shard`: the shard these reads are for (the plan's id)."""
        if shard is not None and self.future is not None:
            self.future.reached(shard)
        # what each range needs of each block: (range, block name, the block's bytes
        # [lo, hi) of the file, and the part [x, y) of the block wanted)
        needs: list[tuple[int, str, int, int, int, int]] = []
        for i, (a, b) in enumerate(zip(starts, ends)):
            size = indexed[i][0]
            key = shard_key(urls[i], indexed[i][1])
            for lo in range(a - a % self.block, b, self.block):
                hi = min(lo + self.block, size)
                needs.append((i, f"{key}-{lo}-{hi}.blk", lo, hi, max(a, lo) - lo, min(b, hi) - lo))
        parts: dict[int, bytes] = {}  # need -> its bytes, served from disk
        missing: dict[str, tuple[int, int, int]] = {}  # block name -> (range, lo, hi)
        for k, (i, name, lo, hi, x, y) in enumerate(needs):
            data = None if name in missing else self._get(name, x, y)
            if data is None:
                missing.setdefault(name, (i, lo, hi))
            else:
                parts[k] = data
        if parts:
            self._check_remote(fs, {needs[k][0] for k in parts}, urls, indexed)
            current().add("cache_hit_bytes", sum(len(d) for d in parts.values()))
        whole: dict[str, bytes] = {}  # block name -> the whole block
        mine = []
        for name in missing:
            if self._claim(name):
                data = self._get(name)  # written by another process since it was missing?
                if data is None:
                    mine.append(name)
                    continue
                self._unclaim(name)
                whole[name] = data
                current().add("cache_hit_bytes", len(data))
        try:
            whole.update(self._fetch(mine, missing, urls, indexed, fetch))
        finally:
            for name in mine:
                self._unclaim(name)
        late = []
        for name in missing:  # fetched by another process of the node: wait for it
            if name not in whole:
                data = self._wait(name)
                if data is None:
                    late.append(name)
                else:
                    whole[name] = data
                    current().add("cache_hit_bytes", len(data))
        whole.update(self._fetch(late, missing, urls, indexed, fetch))
        out: list[list[bytes]] = [[] for _ in urls]
        for k, (i, name, _, _, x, y) in enumerate(needs):
            out[i].append(parts[k] if k in parts else whole[name][x:y])
        return [p[0] if len(p) == 1 else b"".join(p) for p in out]

    def _fetch(
        self,
        names: list[str],
        blocks: dict[str, tuple[int, int, int]],
        urls: Sequence[str],
        indexed: Sequence[Indexed],
        fetch: Fetch,
    ) -> dict[str, bytes]:
        """Fetch the blocks `names` (consecutive blocks of a file in one range) and keep
        them as the policy allows."""
        if not names:
            return {}
        runs: list[tuple[int, int, int, list[str]]] = []  # (url index, start, end, names)
        for name in names:
            i, lo, hi = blocks[name]
            if runs and runs[-1][0] == i and runs[-1][2] == lo:
                runs[-1] = (i, runs[-1][1], hi, [*runs[-1][3], name])
            else:
                runs.append((i, lo, hi, [name]))
        data = fetch(
            [urls[i] for i, *_ in runs],
            [lo for _, lo, _, _ in runs],
            [hi for _, _, hi, _ in runs],
            [indexed[i] for i, *_ in runs],
        )
        out: dict[str, bytes] = {}
        for (_, lo, _, run), blob in zip(runs, data):
            if len(run) == 1 and len(blob) == blocks[run[0]][2] - blocks[run[0]][1]:
                out[run[0]] = blob
                self._put(run[0], blob)
                continue
            for name in run:
                _, a, b = blocks[name]
                out[name] = blob[a - lo : b - lo]
                self._put(name, out[name])
        return out

    def _check_remote(
        self, fs: Any, which: set[int], urls: Sequence[str], indexed: Sequence[Indexed]
    ) -> None:
        """StaleIndexError if a shard served from the cache is no longer its indexed
        version on the remote (checked once a shard per cache object: one reading)."""
        for i in sorted(which):
            key = shard_key(urls[i], indexed[i][1])
            if key in self._checked:
                continue
            fs.invalidate_cache(fs._strip_protocol(urls[i]))
            check_version(fs, urls[i], *indexed[i])
            current().add("requests", 1)
            with self._lock:
                self._checked.add(key)

    # --- the files ---------------------------------------------------------------------

    def _get(self, name: str, x: int = 0, y: int | None = None) -> bytes | None:
        """Bytes [x, y) of the block (y None: its end) if the folder holds it intact (the
        size, the trailer and the checksums of the pieces read); a damaged block is
        deleted and None returned."""
        m = _NAME.match(name)
        assert m is not None
        n = int(m.group(3)) - int(m.group(2))
        y = n if y is None else y
        path = self.folder / name
        crcs = -(-n // PIECE)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                problem = None
                if size != n + 4 * crcs + _TRAILER.size:
                    problem = f"{size} bytes, expected {n + 4 * crcs + _TRAILER.size}"
                else:
                    f.seek(n)
                    tail = f.read()
                    magic, count, length = _TRAILER.unpack_from(tail, 4 * crcs)
                    if magic != _MAGIC or count != crcs or length != n:
                        problem = "its trailer is not the cache's"
                    else:
                        p0, p1 = x // PIECE, -(-y // PIECE)
                        f.seek(p0 * PIECE)
                        data = f.read(min(n, p1 * PIECE) - p0 * PIECE)
                        want = struct.unpack_from(f"<{p1 - p0}I", tail, 4 * p0)
                        view = memoryview(data)
                        for k, crc in enumerate(want):
                            if zlib.crc32(view[k * PIECE : (k + 1) * PIECE]) != crc:
                                problem = f"the checksum of bytes [{(p0 + k) * PIECE}, ...) fails"
                                break
        except FileNotFoundError:
            return None
        if problem is not None:
            log.warning("cache: %s is damaged (%s): fetching the block again", path, problem)
            self._delete(name)
            return None
        if self.policy == "lru":
            with contextlib.suppress(OSError):
                os.utime(path)  # recency is the file's mtime, shared by the node
        skip = x - p0 * PIECE
        return data[skip : skip + (y - x)] if (skip or len(data) != y - x) else data

    def _put(self, name: str, data: bytes) -> None:
        """Write the block atomically if the policy keeps it."""
        need = len(data) + 4 * -(-len(data) // PIECE) + _TRAILER.size
        with self._room:  # decide and reserve at once: reader threads put concurrently
            if not self._make_room(name, need):
                return
            with self._lock:
                self._pending[name] = need
        tmp = self.folder / f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            view = memoryview(data)
            crcs = [zlib.crc32(view[at : at + PIECE]) for at in range(0, len(data), PIECE)]
            with open(tmp, "wb") as f:
                f.write(data)
                f.write(struct.pack(f"<{len(crcs)}I", *crcs))
                f.write(_TRAILER.pack(_MAGIC, len(crcs), len(data)))
            os.replace(tmp, self.folder / name)
        except OSError as e:  # a full disk must not fail the read: the bytes are here
            log.warning("cache: cannot write %s (%s): not cached", self.folder / name, e)
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._lock:
                self._pending.pop(name, None)
            return
        with self._lock:
            self._held[name] = self._changed[name] = self._pending.pop(name)

    def _delete(self, name: str) -> None:
        if _NAME.match(name) is None:  # never a file the cache did not name
            raise AssertionError(f"cache: refusing to delete {name!r}")
        with contextlib.suppress(FileNotFoundError):
            (self.folder / name).unlink()
        with self._lock:
            self._held.pop(name, None)
            self._changed[name] = None

    def _claim(self, name: str) -> bool:
        """Whether this process now fetches the block (False: another one is)."""
        claim = self.folder / f"{name}.claim"
        for _ in range(2):
            try:
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if not _dead_claim(claim):
                    return False
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()  # a dead process's claim
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{socket.gethostname()} {os.getpid()}")
            return True
        return False

    def _unclaim(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{name}.claim").unlink()

    def _wait(self, name: str) -> bytes | None:
        """The block once the process that claimed it has written it; None if it gave up
        (it did not keep the block, or failed) or took longer than CLAIM_WAIT."""
        claim = self.folder / f"{name}.claim"
        deadline = time.monotonic() + CLAIM_WAIT
        while time.monotonic() < deadline:
            data = self._get(name)
            if data is not None or not claim.exists() or _dead_claim(claim):
                return data if data is not None else self._get(name)
            time.sleep(POLL)
        return None

    # --- what is held, and eviction -------------------------------------------------------

    def held(self, rescan: bool = False) -> dict[str, int]:
        """{block file name: bytes on disk} of the folder (re-listed when older than RESCAN
        seconds, or when asked); temporary files a killed process left are removed."""
        now = time.monotonic()
        if rescan or now - self._scanned > RESCAN:
            with self._lock:  # what this process writes and deletes during the listing
                self._changed = {}
            found: dict[str, int | None] = {}
            with os.scandir(self.folder) as entries:
                for e in entries:
                    if _NAME.match(e.name):
                        with contextlib.suppress(FileNotFoundError):
                            found[e.name] = e.stat().st_size
                    elif _TEMP.match(e.name):
                        with contextlib.suppress(FileNotFoundError):
                            if time.time() - e.stat().st_mtime > CLAIM_WAIT:
                                os.unlink(e.path)
            with self._lock:
                found.update(self._changed)
                self._held = {n: b for n, b in found.items() if b is not None}
                self._scanned = now
        with self._lock:
            return {**self._held, **self._pending}

    def held_bytes(self) -> int:
        """Bytes the folder holds in blocks (re-listed now)."""
        return sum(self.held(rescan=True).values())

    def _make_room(self, name: str, need: int) -> bool:
        """Whether to keep a block of `need` bytes, after evicting what the policy says."""
        if self.limit is None:
            return True
        if need > self.limit:
            return False
        held = self.held()
        total = sum(held.values())
        if total + need <= self.limit:
            return True
        held = self.held(rescan=True)
        total = sum(held.values())
        if total + need <= self.limit:
            return True
        with self._lock:
            writing = set(self._pending)
        victims = self._victims(name, {n: b for n, b in held.items() if n not in writing})
        if victims is None or total - sum(held[v] for v in victims) + need > self.limit:
            return False  # what may go would not make room: evict nothing
        for victim in victims:
            if total + need <= self.limit:
                break
            self._delete(victim)
            total -= held[victim]
        return total + need <= self.limit

    def _victims(self, name: str, held: dict[str, int]) -> list[str] | None:
        """Held blocks in the order to evict them to keep `name`; None: `name` itself is
        the one to leave out (next-use: needed later than everything held)."""
        names = [n for n in held if n != name]
        if self.policy == "lru" or self.future is None:

            def mtime(n: str) -> float:
                try:
                    return (self.folder / n).stat().st_mtime
                except FileNotFoundError:
                    return -1.0

            return sorted(names, key=mtime)
        future = self.future
        shard_of = {}
        for n in {*names, name}:
            shard_of[n] = future.shard_of(n[:32])
        known = sorted({s for s in shard_of.values() if s is not None})
        uses = dict(zip(known, future.next_use(known)))
        mine = shard_of[name]
        # the new block's next use after the read now under way
        own = future.next_use([mine], after=True)[0] if mine is not None else float("inf")

        def when(n: str) -> float:
            s = shard_of[n]
            return float("inf") if s is None else uses[s]

        later = sorted((n for n in names if when(n) > own), key=when, reverse=True)
        return later or None
