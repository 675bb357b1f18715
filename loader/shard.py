"""Shard: one shard file as the index records it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Shard"]


@dataclass(frozen=True)
class Shard:
    """One shard file: URL, format, records, bytes, version (etag or mtime), and what a
    reader needs to find its records (Parquet row groups, tar member ranges)."""

    url: str
    format: str
    num_records: int
    bytes: int
    version: str | None
    details: dict[str, Any] = field(repr=False)
