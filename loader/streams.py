"""`Stream`: one source of a mixture, as users name it (loader.mixture reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["STREAM", "Stream", "is_mixture"]

STREAM = "__stream__"  # records: the stream's name; batches: int64 stream indices


@dataclass(frozen=True)
class Stream:
    """One source of a mixture: anything a single dataset takes as `source`, its weight
    (default: its record count, i.e. natural proportions), its name (default: the source
    string; names are unique, and seed the stream's shuffles) and its own storage options
    (default: the dataset's), so two streams may live in two buckets or endpoints.
    `cache_dir` and `cache_limit` (default: the dataset's) give the stream its own node
    cache folder and bound (loader.cache)."""

    source: Any
    weight: float | None = None
    name: str | None = None
    storage_options: dict[str, Any] | None = None
    cache_dir: Any = None
    cache_limit: int | str | None = None


def is_mixture(source: Any) -> bool:
    """Whether a dataset source is a list of Streams."""
    return (
        isinstance(source, list | tuple)
        and len(source) > 0
        and all(isinstance(s, Stream) for s in source)
    )
