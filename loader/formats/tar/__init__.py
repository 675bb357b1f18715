"""Tar shards in the WebDataset convention: one header pass to index, byte-range reads of
exactly the assigned members afterwards.

- `format`: `TarFormat`, the reader.
- `scan`: the header walk that indexes a tar, and the header checks of a read.
- `groups`: a tar's members grouped into webdataset samples, as arrays.
- `members`: a shard's member table as arrays (`Keys`, `Members`).
- `decode`: samples decoded as webdataset's ``.decode(*specs)`` decodes them.
- `idx`: DALI ``.idx`` sidecars beside the shards: read, checked, written.
- `wids`: wids shard lists beside the shards: record counts without reading them.

``from shardstream.loader.formats.tar import TarFormat`` works as it did when this was one
module (imported when first used, PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstream.sampler.lazy import lazy_names

if TYPE_CHECKING:
    from .format import TarFormat

__all__ = ["TarFormat"]

__getattr__, __dir__ = lazy_names(__name__, {"TarFormat": ".format"}, globals())
