"""One read group of a reading, and what the reading's stages need of the reader.

A `Group` is rows [first, stop) of one shard, read together (loader.read.reading schedules
groups, loader.read.decoding decodes them, loader.read.plan_reader fetches them): its future
gets the decoded block. `GroupReader` is what those stages call on the reader above them
(loader.read.plan_reader.PlanReader is one), so that each stage imports only the stages below.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..formats import Format
    from ..index.shard_index import ShardIndex
    from ..stats import Stats
    from ..storage.through import ByteCache
    from .budget import MemoryBudget

__all__ = ["Group", "GroupReader", "Holder", "Stopped", "finish"]


class Holder(Protocol):
    """Where a group waits between its fetch and its decoding (loader.read.decoding.Ahead):
    what the reader and a group's end call on it."""

    halted: bool  # a fetch failed or reading stopped: no new fetch starts

    def claim(self, entry: Group) -> list[Group]:
        """The groups a fetch of `entry` reads (it, and later groups of its shard)."""
        ...

    def fetched(self, entry: Group, raw: Any) -> None:
        """`entry`'s bytes arrived: decode it when its turn comes."""
        ...

    def wake(self) -> None:
        """A group's reading ended: a consumer waiting for one looks again."""
        ...


class GroupReader(Protocol):
    """What a reading's stages need of the reader above them."""

    index: ShardIndex
    fmt: Format
    columns: list[str] | None
    budget: MemoryBudget
    read_threads: int
    prefetch: int | None
    decoders: ThreadPoolExecutor | None
    readers: ThreadPoolExecutor | None
    stats: Stats

    @property
    def cache(self) -> ByteCache | None:
        """The node cache remote reads go through, if any."""
        ...

    def fetch(self, fs: Any, entry: Group) -> None:
        """Fetch `entry` (and the groups it takes along); its future gets the block."""
        ...

    def decode(self, fs: Any, entry: Group, raw: Any, table: Any = None, failed: Any = None) -> Any:
        """`entry`'s block from its fetched bytes (`table`: its rows, read on a reading
        thread; `failed`: that read's error instead)."""
        ...

    def estimate(self, shard_id: int, start: int, stop: int) -> tuple[int, int]:
        """(what the budget is charged, the format's estimate) for rows [start, stop)."""
        ...


class Stopped(Exception):
    """A queued read not started: an earlier read failed (its error is the one raised,
    since reads start in submission order and results are taken in that order)."""


class Group:
    """One read group: rows [first, stop) of shard number `shard`, `order`-th started; its
    reading (`future`: the joined block), what it holds in the budget (`charged`: the
    estimate while it is read, then its measured size; `raw`: the format's estimate), and
    its place in the cushion of decoded groups (`ahead`)."""

    __slots__ = (
        "ahead",
        "charged",
        "checked",
        "claimed",
        "counted",
        "dropped",
        "first",
        "future",
        "needed",
        "order",
        "raw",
        "shard",
        "stop",
        "stored",
    )

    def __init__(
        self, order: int, shard: int, rows: tuple[int, int], charge: tuple[int, int], ahead: Holder
    ) -> None:
        self.order, self.shard = order, shard
        self.first, self.stop = rows
        self.charged, self.raw = charge
        self.ahead = ahead
        self.future: Future[Any] = Future()
        self.needed = self.dropped = self.counted = self.checked = self.claimed = False
        self.stored = 0  # bytes of the shard a read of it fetches (all columns: at most)


def finish(entry: Group, block: Any, error: BaseException | None = None) -> None:
    """Complete a group's future with its block (None: let go unread) or its error, and
    wake a consumer waiting for its bytes (`loader.read.decoding.Ahead.take`)."""
    if error is not None:
        entry.future.set_exception(error)
    else:
        entry.future.set_result(block)
    entry.ahead.wake()
