"""Read groups between their fetch and the consumer: who decodes each, and when.

A group (loader.read.groups) is one read group of a reading: its future gets the decoded
block. `Ahead` holds the fetched groups until they are decoded: by the consumer itself
when it needs one (local files on 2 cores: see `decode_threads`), or by decoding threads a
few groups ahead of need, in reading order.
"""

from __future__ import annotations

import bisect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from torch.utils.data import get_worker_info

from .groups import Group, GroupReader, finish

__all__ = ["FETCH_BYTES", "Ahead", "decode_threads", "decoding_pool"]

FETCH_BYTES = 16 << 20  # off local disk, a shard's groups are fetched together up to this


def decode_threads(local: bool = True) -> int:
    """Threads that decode groups ahead of need, beside the consuming thread, which decodes
    a group itself when it needs it and no thread has.

    Local files: the cores this process may use but two (the consumer's, and one for the
    training loop); none inside a DataLoader worker (a worker is one process a core). With
    Python's GIL a decoding thread takes the GIL back after every pyarrow call, each time
    the consumer holds it: measured on 2 cores (`python -m scripts.bench`, 16 shards x 8,192
    rows), one decoding thread cost 2.9 us of CPU a record, decoding in the consumer 2.3
    us, and read no faster (pyarrow releases the GIL while it decodes a group).

    Remote shards (`local=False`): the cores but one, at least one, as before: the
    consumer would otherwise decode while the fetching threads wait on it (measured over
    S3 at 30 ms: 0.50x the ranged-GET limit with the consumer decoding, 0.79x with one
    decoding thread)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if not local:
        return max(1, cores - 1)
    if get_worker_info() is not None:
        return 0
    return max(0, cores - 2)


def decoding_pool(local: bool = True) -> ThreadPoolExecutor:
    """A pool for `decode_threads(local)` decoding threads (at least one thread object: an
    executor needs one, and with no decoding threads nothing is submitted to it)."""
    threads = max(1, decode_threads(local))
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")


class Ahead:
    """Decoding, in reading order, only a few groups before they are needed.

    Fetching runs as far ahead as the budget allows; a fetched group then waits here until
    the consumer needs it or fewer than `limit` decoded groups wait for the consumer:
    decoded data is larger than fetched bytes (locally nothing is fetched before
    decoding), and a decoded group is of no use until needed, so a small cushion does
    (about one next group a piece, and one a decoding thread). No thread blocks here:
    groups wait in a list and go to the decoding threads as room appears.
    """

    def __init__(
        self, limit: int, decoders: ThreadPoolExecutor, reader: GroupReader, fs: Any, threads: int
    ) -> None:
        self.limit, self.decoders, self.reader, self.fs = limit, decoders, reader, fs
        self.threads = threads  # decoding threads (0: the consumer decodes every group)
        self.count = 0  # decoded groups the consumer does not need yet
        self.running = 0  # groups being decoded
        self.waiting: list[tuple[int, Group, Any]] = []  # (order, group, fetched), sorted
        self.unfetched: dict[int, list[Group]] = {}  # shard -> groups started, not fetched
        self.merge = not isinstance(fs, LocalFileSystem)  # fetch a shard's groups together
        self.halted = False  # set when a fetch fails or reading stops: no new fetch starts
        self._lock = threading.Condition()  # notified when fetched bytes arrive

    def started(self, entries: list[Group]) -> None:
        """These groups' fetches are about to be queued (in reading order)."""
        with self._lock:
            for entry in entries:
                self.unfetched.setdefault(entry.shard, []).append(entry)

    def claim(self, entry: Group) -> list[Group]:
        """The groups a fetch of `entry` reads: none if an earlier fetch took it along;
        else it and (off local disk, after the reading's first group) the next groups of
        its shard not being fetched yet, up to FETCH_BYTES stored."""
        with self._lock:
            if entry.claimed:
                return []
            queue = self.unfetched.get(entry.shard, [])
            together, size = [], 0
            for other in [entry, *(q for q in queue if q is not entry)]:
                if other.claimed or (other is not entry and other.dropped):
                    continue
                # the first group read goes alone: the first record waits for its bytes only
                alone = not self.merge or entry.order == 1
                if other is not entry and (alone or size + other.stored > FETCH_BYTES):
                    break
                other.claimed = True
                together.append(other)
                size += other.stored
            left = [q for q in queue if not q.claimed]
            if left:
                self.unfetched[entry.shard] = left
            else:
                self.unfetched.pop(entry.shard, None)
            return together

    def fetched(self, entry: Group, raw: Any) -> None:
        """`entry`'s bytes arrived (in a fetching thread): decode it when its turn comes."""
        with self._lock:
            dropped = entry.dropped
            if not dropped:
                bisect.insort(self.waiting, (entry.order, entry, raw), key=_first)
                self._dispatch()
                self._lock.notify_all()
        if dropped:
            finish(entry, None)

    def need(self, entry: Group, drop: bool = False) -> None:
        """The consumer needs `entry` now (or, `drop`, never): it leaves the cushion, and is
        decoded at once if its bytes wait here (or let go)."""
        dropped = None
        with self._lock:
            entry.needed = True
            entry.dropped = entry.dropped or drop
            if entry.counted:
                entry.counted = False
                self.count -= 1
            if drop:
                for i, item in enumerate(self.waiting):
                    if item[1] is entry:
                        dropped = self.waiting.pop(i)[1]
                        break
            self._dispatch()
        if dropped is not None:
            finish(dropped, None)

    def _dispatch(self) -> None:
        """(Holding the lock) hand to the decoding threads the waiting groups the consumer
        needs, and the next ones in reading order while the cushion has room."""
        if not self.threads:  # the consumer decodes each group itself (`take`)
            return
        keep = []
        for needed in (True, False):  # the groups needed now first
            for item in self.waiting:
                if item[1].needed != needed:
                    continue
                room = needed or self.count + self.running < self.limit
                if room and self.running < self.threads:
                    self.running += 1
                    self.decoders.submit(self._decode, item[1], item[2])
                else:
                    keep.append(item)
        keep.sort(key=_first)
        self.waiting = keep

    def take(self, entry: Group) -> tuple[bool, Any]:
        """(True, its fetched bytes) if `entry` waits here for a decoding thread: the
        consumer, waiting for it anyway, decodes it itself (`decode_here`). With no
        decoding threads, waits for the bytes to arrive (False once its reading is over
        without them: a failed fetch, or the group let go)."""
        with self._lock:
            while True:
                for i, item in enumerate(self.waiting):
                    if item[1] is entry:
                        self.running += 1
                        return True, self.waiting.pop(i)[2]
                if self.threads or entry.future.done():
                    return False, None
                # notified by `fetched` and by any group's end (`finish`); the timeout only
                # guards against a path that ends a group without either
                self._lock.wait(1.0)

    def wake(self) -> None:
        """A group's reading ended (decoded, failed, let go): a consumer waiting in `take`
        looks again."""
        with self._lock:
            self._lock.notify_all()

    def decode_here(self, entry: Group, raw: Any) -> None:
        self._decode(entry, raw)

    def _decode(self, entry: Group, raw: Any) -> None:
        block, error = None, None
        try:
            block = self.reader.decode(self.fs, entry, raw)
        except BaseException as e:
            error = e
        with self._lock:
            self.running -= 1
            if block is not None and not entry.needed and not entry.dropped:
                entry.counted = True
                self.count += 1
            self._dispatch()
        finish(entry, block, error)


def _first(item: tuple[int, Group, Any]) -> int:
    return item[0]
