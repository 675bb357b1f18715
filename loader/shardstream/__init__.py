"""shardstream: stream sharded datasets (Parquet, Arrow IPC, WebDataset tar; local, S3,
GCS, Azure, HTTP) into PyTorch, each record once an epoch over all ranks and workers.

The public API in one place::

    from shardstream import StreamingDataset

    ds = StreamingDataset("data/", batch_size=256)

The distribution installs this one top-level name. Its parts are subpackages:
``shardstream.loader`` (storage, index, readers, the dataset), ``shardstream.sampler``
(pure planning), ``shardstream.plan`` (the ``shardstream-plan`` command) and
``shardstream.write`` (``write_shards`` and the ``shardstream-write`` command), so a
``loader.py`` or ``sampler.py`` of a user's own project never shadows them.
"""

import sys as _sys
from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from .sampler.lazy import lazy_names as _lazy_names

if TYPE_CHECKING:
    from .loader import (
        Batch,
        MixtureDataset,
        Pack,
        RetryPolicy,
        Shard,
        ShardError,
        ShardIndex,
        StaleIndexError,
        StaleSidecarError,
        Stream,
        StreamingDataset,
    )
    from .loader.storage.ranged_get import RangeIgnoredError
    from .sampler import DistributedSampler, MixtureSampler, ShardSampler
    from .write import WriteSummary, write_shards

# names imported when first used (PEP 562), as in shardstream.loader: the planner's
# simulations (shardstream.plan) import this package without torch
_WHERE = {
    **dict.fromkeys(
        [
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
        ],
        ".loader",
    ),
    "RangeIgnoredError": ".loader.storage.ranged_get",
    **dict.fromkeys(["DistributedSampler", "MixtureSampler", "ShardSampler"], ".sampler"),
    **dict.fromkeys(["WriteSummary", "write_shards"], ".write"),
}

try:
    __version__ = _version("shardstream")
except _NotInstalled:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Batch",
    "DistributedSampler",
    "MixtureDataset",
    "MixtureSampler",
    "Pack",
    "RangeIgnoredError",
    "RetryPolicy",
    "Shard",
    "ShardError",
    "ShardIndex",
    "ShardSampler",
    "StaleIndexError",
    "StaleSidecarError",
    "Stream",
    "StreamingDataset",
    "WriteSummary",
    "__version__",
    "write_shards",
]


__getattr__ = _lazy_names(__name__, _WHERE, globals())[0]


def __dir__() -> list[str]:
    """The public API (and the subpackages), not the helpers this module uses."""
    return sorted({*__all__, "loader", "sampler"})


if "torch" in _sys.modules:  # a training process: the dataset's imports now (loader's too)
    from .loader import StreamingDataset

del TYPE_CHECKING, _NotInstalled, _lazy_names, _sys, _version
