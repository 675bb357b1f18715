"""Parquet shards: indexed from their footers alone, read by row group and column.

- `format`: `ParquetFormat`, the reader (what the index keeps, what a read fetches);
  `blocks`: its block side (decoded groups joined, gathered, made into batches).
- `meta`: footers parsed, the index's details, byte ranges of row groups and columns, the
  cache of parsed footers.
- `fetch`: what a read fetched (`Fetched`), column chunks fetched, decoded tables into
  batches (shared with the Arrow IPC reader, loader.formats.arrow).
- `local`: pyarrow's `ParquetFile` kept open per reading thread, in the pool it wants.
- `thrift`: whether a footer's column chunks carry encryption metadata.

``from shardstream.loader.formats.parquet import ParquetFormat`` works as it did when this
was one module (imported when first used, PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstream.sampler.lazy import lazy_names

if TYPE_CHECKING:
    from .format import ParquetFormat

__all__ = ["ParquetFormat"]

__getattr__, __dir__ = lazy_names(__name__, {"ParquetFormat": ".format"}, globals())
