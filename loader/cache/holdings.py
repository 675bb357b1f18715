"""What a node cache's folder holds, and what to evict to make room: the bookkeeping half of
loader.cache.node.NodeCache (a base class of it, over the state NodeCache keeps).

The node's processes share one count of the bytes their blocks hold and reserve (the file
COUNT in the folder, changed under a lock on it): a block is kept only if the count leaves
room for it, so the node's processes together never pass the limit, however unevenly they
write. When the count says a block would pass it, the folder is listed (blocks, and
blocks being fetched: claimed), the count set to what it holds, and blocks are evicted by
next use (`Future`: the node's plans) or, for comparison, least recently read
(`policy="lru"`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from .files import CLAIM_WAIT, NAME, TEMP, file_bytes

__all__ = ["COUNT", "RESCAN", "Future", "Holdings"]

RESCAN = 1.0  # seconds the folder's listing is trusted for (the node's writes change it)
COUNT = ".held"  # in the folder: the node's block bytes held and reserved (and its lock)


class Future(Protocol):
    """When the node reads each shard next (loader.cache.next_use.NextUse)."""

    def shard_of(self, key: str) -> int | None: ...
    def next_use(self, shards: Sequence[int], after: bool = False) -> list[float]: ...
    def reached(self, shard: int) -> None: ...


class Holdings:
    """The folder's blocks as this process knows them, and eviction (see the module
    docstring). The attributes are set by NodeCache.__init__."""

    folder: Path
    limit: int | None
    future: Future | None
    policy: str
    block: int
    sharers: int
    _lock: threading.Lock
    _pending: dict[str, int]
    _changed: dict[str, int | None]
    _held: dict[str, int]
    _inflight: dict[str, int]
    _scanned: float

    def _delete(self, name: str, counted: bool = True) -> None:
        raise NotImplementedError

    def held(self, rescan: bool = False) -> dict[str, int]:
        """{block file name: bytes on disk} of the folder (re-listed when older than RESCAN
        seconds, or when asked), counting the blocks being fetched (claimed: by this
        process or another of the node) at their size; temporary files a killed process
        left are removed."""
        now = time.monotonic()
        if rescan or now - self._scanned > RESCAN:
            with self._lock:  # what this process writes and deletes during the listing
                self._changed = {}
            found: dict[str, int | None] = {}
            inflight: dict[str, int] = {}  # blocks being fetched (claimed), by their names
            with os.scandir(self.folder) as entries:
                for e in entries:
                    if NAME.match(e.name):
                        with contextlib.suppress(FileNotFoundError):
                            found[e.name] = e.stat().st_size
                    elif e.name.endswith(".claim") and (m := NAME.match(e.name[:-6])):
                        inflight[e.name[:-6]] = file_bytes(int(m.group(3)) - int(m.group(2)))
                    elif TEMP.match(e.name):
                        with contextlib.suppress(FileNotFoundError):
                            if time.time() - e.stat().st_mtime > CLAIM_WAIT:
                                os.unlink(e.path)
            with self._lock:
                found.update(self._changed)
                self._held = {n: b for n, b in found.items() if b is not None}
                self._inflight = {n: b for n, b in inflight.items() if n not in self._held}
                self._scanned = now
        with self._lock:
            return {**self._inflight, **self._held, **self._pending}

    def held_bytes(self) -> int:
        """Bytes the folder holds in blocks (re-listed now)."""
        return sum(self.held(rescan=True).values())

    def _make_room(self, name: str, need: int) -> bool:
        """Whether to keep a block of `need` bytes, after evicting what the policy says;
        if so, its bytes are added to the node's count (`_counted`) at once."""
        if self.limit is None:
            return True
        if need > self.limit:
            return False
        with self._counted() as count:
            if count[0] is not None and count[0] + need <= self.limit:
                count[0] += need
                return True
            # over the limit by the count (or no count yet): the folder says what the node
            # holds and fetches (claimed blocks), and what to evict
            held = self.held(rescan=True)
            held.pop(name, None)  # this block: claimed by this process, reserved now
            total = sum(held.values())
            if total + need <= self.limit:
                count[0] = total + need
                return True
            with self._lock:
                writing = {*self._pending, *self._inflight}
            victims = self._victims(name, {n: b for n, b in held.items() if n not in writing})
            if victims is None or total - sum(held[v] for v in victims) + need > self.limit:
                count[0] = total
                return False  # what may go would not make room: evict nothing
            # room for this block, and for one more block of each process (so the next
            # writes need not list the folder again), from blocks needed later than this one
            room = need + (self.sharers - 1) * self.block
            for victim in victims:
                if total + room <= self.limit:
                    break
                self._delete(victim, counted=False)
                total -= held[victim]
            keep = total + need <= self.limit
            count[0] = total + need if keep else total
            return keep

    @contextlib.contextmanager
    def _counted(self) -> Iterator[list[int | None]]:
        """The node's count of block bytes held and reserved, as ``[count]`` (None: no
        count yet, or unreadable), under an exclusive lock on its file (COUNT, in the
        folder): every process of the node reserves through it, one at a time, so what
        they hold together never passes the limit. Written back if changed. A process
        killed with a reservation leaves the count high, never low: the next write that
        would pass the limit lists the folder and sets the count to what it holds."""
        fd = os.open(self.folder / COUNT, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                box: list[int | None] = [int(os.pread(fd, 32, 0))]
            except ValueError:
                box = [None]
            before = box[0]
            yield box
            if box[0] is not None and box[0] != before:
                os.pwrite(fd, b"%20d\n" % max(0, box[0]), 0)  # fixed width: no stale digits
        finally:
            os.close(fd)  # and the lock with it

    def _release(self, nbytes: int) -> None:
        """Take `nbytes` (blocks deleted, or reserved and never written) off the count."""
        if self.limit is None or nbytes <= 0:
            return
        with self._counted() as count:
            if count[0] is not None:
                count[0] -= nbytes

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
