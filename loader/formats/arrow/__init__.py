"""Arrow IPC shards (``.arrow``, ``.feather``, ``.ipc``): the file and stream formats, read
by record batch, and Feather version 1 files, read whole.

- `format`: `ArrowFormat`, the reader.
- `frames`: the message frames of a file or stream, walked for the index.
- `values`: IPC columns as their values (dictionaries, run-end encoding, views made plain).
- `feather_v1`: Feather version 1 files (``FEA1``).

`ArrowFormat` is imported from here when first used (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstream.sampler.lazy import lazy_names

if TYPE_CHECKING:
    from .format import ArrowFormat

__all__ = ["ArrowFormat"]

__getattr__, __dir__ = lazy_names(__name__, {"ArrowFormat": ".format"}, globals())
