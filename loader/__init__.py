"""Storage, shard index, format readers and the streaming IterableDataset."""

from .batching import Batch
from .dataset import StreamingDataset
from .errors import ShardError, StaleIndexError, StaleSidecarError
from .index import ShardIndex
from .mixture import MixtureDataset
from .retry import RetryPolicy
from .shard import Shard
from .streams import Stream

__shardstream__ = True  # the shardstream package checks that `loader` is this one

__all__ = [
    "Batch",
    "MixtureDataset",
    "RetryPolicy",
    "Shard",
    "ShardError",
    "ShardIndex",
    "StaleIndexError",
    "StaleSidecarError",
    "Stream",
    "StreamingDataset",
]
