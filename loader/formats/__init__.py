"""Shard formats, registered in one place, chosen by file suffix.

A sub-package a format: `parquet` (ParquetFormat), `tar` (TarFormat, with DALI ``.idx``
sidecars and wids shard lists), `arrow` (ArrowFormat: Arrow IPC and Feather v1). Shared by
them: `base` (the protocol a format implements), `deferred` (shards indexed by their
reader), `partitions` (Hive partition columns), `schemas` (shards written by different
tools).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .arrow.format import ArrowFormat
from .base import Format
from .parquet.format import ParquetFormat
from .tar.format import TarFormat

__all__ = ["FORMATS", "INDEX_FILE", "Format", "format_for", "format_of_url", "formats_of_urls"]

FORMATS: dict[str, Any] = {"parquet": ParquetFormat, "arrow": ArrowFormat, "tar": TarFormat}
_BY_SUFFIX = {s: name for name, cls in FORMATS.items() for s in cls.suffixes}


INDEX_FILE = ".index.arrow"  # a saved index (loader.index.saved): Arrow, but not a shard


def format_of_url(url: str) -> str | None:
    """The format a file's suffix names, or None."""
    lower = url.lower()
    if lower.endswith(INDEX_FILE):
        return None
    return next((name for s, name in _BY_SUFFIX.items() if lower.endswith(s)), None)


def formats_of_urls(urls: pa.Array) -> dict[str, pa.Array]:
    """`format_of_url` of many URLs at once (Arrow strings): per format, a boolean mask of
    the URLs of that format (no URL is copied: a million URLs cost bitmaps)."""
    index = pc.ends_with(urls, INDEX_FILE, ignore_case=True)
    out: dict[str, pa.Array] = {}
    for suffix, name in _BY_SUFFIX.items():
        hit = pc.and_not(pc.ends_with(urls, suffix, ignore_case=True), index)
        out[name] = hit if name not in out else pc.or_(out[name], hit)
    return out


def known_suffixes() -> str:
    return ", ".join(sorted(_BY_SUFFIX))


def format_for(name: str, **options: Any) -> Format:
    """An instance of the named format; unknown names list the known ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown shard format {name!r}; known formats: {sorted(FORMATS)}")
    instance: Format = FORMATS[name](**options)
    return instance
