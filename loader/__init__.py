"""Storage, shard index, format readers and the streaming IterableDataset."""

from .dataset import StreamingDataset
from .errors import ShardError, StaleIndexError, StaleSidecarError
from .index import ShardIndex
from .mixture import MixtureDataset
from .retry import RetryPolicy
from .shard import Shard
from .streams import Stream

__all__ = [
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
