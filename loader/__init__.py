"""Storage, shard index, format readers and the streaming IterableDataset.

Its names are imported when first used (PEP 562): ``import loader`` alone costs nothing
(the planner's simulations never import torch), ``from loader import StreamingDataset``
imports what the dataset needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampler.lazy import lazy_names

from .errors import ShardError, StaleIndexError, StaleSidecarError

if TYPE_CHECKING:
    from .batching import Batch
    from .dataset import StreamingDataset
    from .index import ShardIndex
    from .mixture import MixtureDataset
    from .retry import RetryPolicy
    from .shard import Shard
    from .streams import Stream

__shardstream__ = True  # the shardstream package checks that `loader` is this one

_WHERE = {
    "Batch": ".batching",
    "MixtureDataset": ".mixture",
    "RetryPolicy": ".retry",
    "Shard": ".shard",
    "ShardIndex": ".index",
    "Stream": ".streams",
    "StreamingDataset": ".dataset",
}

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


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
