"""shardstream: stream sharded datasets (Parquet, Arrow IPC, WebDataset tar; local, S3,
HTTP) into PyTorch, each record once an epoch over all ranks and workers.

The public API in one place::

    from shardstream import StreamingDataset

    ds = StreamingDataset("data/", batch_size=256)

It re-exports the implementation packages ``loader`` (storage, index, readers, the
dataset) and ``sampler`` (pure planning), which stay importable as they are. Those two
generic top-level names can be shadowed by a user's own ``loader.py`` or ``sampler.py``
on ``sys.path``: importing shardstream then raises an ImportError naming that file,
instead of failing somewhere inside.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType


def _ours(name: str) -> ModuleType:
    """Import the implementation package `name`, refusing someone else's module of the
    same name (ours carry ``__shardstream__ = True``)."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"shardstream could not import its package {name!r}: {e}") from e
    if not getattr(module, "__shardstream__", False):
        where = getattr(module, "__file__", None) or repr(module)
        raise ImportError(
            f"shardstream imports its parts as the top-level packages 'sampler' and 'loader', "
            f"but {name!r} is {where}, not shardstream's: a module or folder of that name in "
            f"your project (or the current directory) shadows it; rename it"
        )
    return module


_ours("sampler")
_ours("loader")

from loader import (  # noqa: E402  (after the shadowing check)
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
from loader.storage.ranged_get import RangeIgnoredError  # noqa: E402
from sampler import DistributedSampler, MixtureSampler, ShardSampler  # noqa: E402

try:
    __version__ = version("shardstream")
except PackageNotFoundError:  # imported from a source tree that was never installed
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
    "__version__",
]
