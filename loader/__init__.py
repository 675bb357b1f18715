"""Storage, shard index, format readers and the streaming IterableDataset."""

from .dataset import StreamingDataset
from .errors import ShardError, StaleIndexError
from .index import ShardIndex
from .shard import Shard

__all__ = ["Shard", "ShardError", "ShardIndex", "StaleIndexError", "StreamingDataset"]
