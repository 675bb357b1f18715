"""The small protocol every shard format implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..shard import Shard
from ..storage.filesystems import FileEntry

__all__ = ["Format"]


class Format(Protocol):
    """One shard format: how to index a shard, read a row range, and shape the records.

    A *part* is what `read` returns for rows [start, stop) of one shard (an Arrow table,
    a list of sample dicts); `join` makes it (or several) a gatherable block, `gather`
    takes rows from several blocks in reading order, `cut` cuts what it took into batches.
    """

    name: str
    suffixes: tuple[str, ...]

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """Per shard: {"num_records": n, "details": {...}} (JSON-serializable), read with as
        little I/O as the format allows."""
        ...

    def read(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> Any:
        """Rows [start, stop) of the shard in storage order."""
        ...

    def fetch(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> Any:
        """The storage part of `read` (what has to come from storage, nothing decoded);
        ``decode(fs, fetch(...))`` is ``read(...)``."""
        ...

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
    ) -> list[Any]:
        """`fetch` of several row ranges of one shard, read together where the format
        can (fewer, larger requests)."""
        ...

    def decode(self, fs: Any, fetched: Any) -> Any:
        """The decoding part of `read`, from what `fetch` returned."""
        ...

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes a read of rows [start, stop) of the shard fetches (all columns)."""
        ...

    def groups(self, shard: Shard) -> list[int]:
        """Records of each of the shard's read groups, in storage order (summing to its
        records): the runs of rows read and decoded as one, which the reading order
        shuffles within (sampler.plan). A pure function of the shard's index entry."""
        ...

    def estimate(self, shard: Shard, start: int, stop: int, columns: Sequence[str] | None) -> int:
        """About how many bytes a read of rows [start, stop) holds once decoded, from the
        index alone (the reader's memory budget charges this until the read is done)."""
        ...

    def check(self, joined: Any, shard: Shard) -> None:
        """Called in reading order as each joined group is first needed, in the consuming
        thread: checks that depend on what was read before (groups are decoded in any
        order by several threads). Raises ShardError naming the shard."""
        ...

    def reserve(self, nbytes: int) -> None:
        """The reader expects to hold at most about `nbytes` of decoded data (a hint)."""
        ...

    def join(self, parts: Sequence[Any]) -> Any:
        """The parts of one block as one gatherable whole, rows numbered part after part."""
        ...

    def release(self, joined: Any) -> None:
        """The joined block is no longer needed (nothing `take` returned refers to it);
        its memory may be reused for the next block."""
        ...

    def nbytes(self, joined: Any) -> int:
        """Bytes a joined block holds in memory."""
        ...

    def take(self, joined: Any, indices: Any) -> Any:
        """Rows `indices` (an int array) of a joined block, in that order."""
        ...

    def gather(self, joined: Sequence[Any], which: Any, rows: Any) -> Any:
        """Row rows[k] of the joined block joined[which[k]], for each k, in that order."""
        ...

    def cut(self, taken: Any, lo: int, hi: int) -> Any:
        """Rows [lo, hi) of what `gather` gave, ready for `records` or `batch`."""
        ...

    def records(self, taken: Any) -> Iterable[Any]:
        """The taken rows as records."""
        ...

    def batch(self, taken: Any) -> dict[str, Any]:
        """The taken rows as one batch: column name -> tensor or list."""
        ...
