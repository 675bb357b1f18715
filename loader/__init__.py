"""Storage, shard index, format readers and the streaming IterableDataset.

The rooms, bottom up (each imports only those before it; loader's own top modules sit
above them all, but for the leaves `errors`, `stats` and `shard`):

- `storage/`  bytes of shard files, local or remote: fsspec, ranged GETs, retries
- `cache/`    the node cache: remote bytes on local disk across epochs
- `columns/`  Arrow columns to batches: kinds, gathering, placement, tensors
- `formats/`  shard formats: Parquet footers and row groups, tar, Arrow IPC, schemas
- `index/`    which shards and records a source has: listing, scanning, the table
- `read/`     a rank's plan fetched and decoded ahead within a memory budget
- `tokens/`   packing tokenized documents into fixed-length blocks (`Pack`)
- top: `dataset` (StreamingDataset), `mixture` (MixtureDataset) on `base`; `options`,
  `streams`, `state` (resume), `epoch`, `cursor`, `stats`, `errors`, `shard`

Its names are imported when first used (PEP 562): ``import loader`` alone costs nothing
(the planner's simulations never import torch), ``from shardstream.loader import StreamingDataset``
imports what the dataset needs. In a process that has imported torch (one that trains),
``import loader`` imports the dataset's modules at once: their ~0.1 s, and the garbage
collection torch's import leaves pending, are paid with the program's other imports, not
inside its first ``loader.StreamingDataset(...)``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from shardstream.sampler.lazy import lazy_names

from .errors import ShardError, StaleIndexError, StaleSidecarError

if TYPE_CHECKING:
    from .columns.batching import Batch
    from .dataset import StreamingDataset
    from .index.shard_index import ShardIndex
    from .mixture import MixtureDataset
    from .shard import Shard
    from .storage.retry import RetryPolicy
    from .streams import Stream
    from .tokens.pack import Pack


_WHERE = {
    "Batch": ".columns.batching",
    "MixtureDataset": ".mixture",
    "Pack": ".tokens.pack",
    "RetryPolicy": ".storage.retry",
    "Shard": ".shard",
    "ShardIndex": ".index.shard_index",
    "Stream": ".streams",
    "StreamingDataset": ".dataset",
}

__all__ = [
    "Batch",
    "MixtureDataset",
    "Pack",
    "RetryPolicy",
    "Shard",
    "ShardError",
    "ShardIndex",
    "StaleIndexError",
    "StaleSidecarError",
    "Stream",
    "StreamingDataset",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())

if "torch" in sys.modules:  # a training process: the dataset's imports now (see above)
    from .dataset import StreamingDataset
