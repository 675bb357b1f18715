"""Storage, shard index, format readers and the streaming IterableDataset."""

from .dataset import StreamingDataset
from .errors import ShardError, StaleIndexError
from .index import Shard, ShardIndex

__all__ = ["Shard", "ShardError", "ShardIndex", "StaleIndexError", "StreamingDataset"]
