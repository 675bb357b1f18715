"""The small protocol every shard format implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..shard import Shard
from ..storage import FileEntry

__all__ = ["Format"]


class Format(Protocol):
    """One shard format: how to index a shard, read a row range, and shape the records.

    A *part* is what `read` returns for rows [start, stop) of one shard (an Arrow table,
    a list of sample dicts); `join` puts a block's parts together, `take` gathers its rows
    in reading order.
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

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes a read of rows [start, stop) of the shard fetches (all columns)."""
        ...

    def join(self, parts: Sequence[Any]) -> Any:
        """The parts of one block as one gatherable whole, rows numbered part after part."""
        ...

    def release(self, joined: Any) -> None:
        """The joined block is no longer needed (nothing `take` returned refers to it);
        its memory may be reused for the next block."""
        ...

    def take(self, joined: Any, indices: Any) -> Any:
        """Rows `indices` (an int array) of a joined block, in that order."""
        ...

    def records(self, taken: Any) -> Iterable[Any]:
        """The taken rows as records."""
        ...

    def batch(self, taken: Any) -> dict[str, Any]:
        """The taken rows as one batch: column name -> tensor or list."""
        ...
