"""Pure planning: which records each rank and worker reads, in which order. No I/O.

The planning functions are numpy only; the samplers (torch's `Sampler` subclasses) are
imported when first used (PEP 562), so planning alone never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names
from .mixing import distinct_per_batch
from .plan import Chunk, Plan
from .planning import all_plans, build_plan

if TYPE_CHECKING:
    from .distributed import DistributedSampler
    from .mixture.sampler import MixturePart, MixtureSampler, PassPiece, stream_seed
    from .shard_sampler import DEFAULT_WINDOW, HasShardSizes, ShardSampler
    from .topology import Topology


_WHERE = {
    "DEFAULT_WINDOW": ".shard_sampler",
    "DistributedSampler": ".distributed",
    "HasShardSizes": ".shard_sampler",
    "MixturePart": ".mixture.sampler",
    "MixtureSampler": ".mixture.sampler",
    "PassPiece": ".mixture.sampler",
    "ShardSampler": ".shard_sampler",
    "Topology": ".topology",
    "stream_seed": ".mixture.sampler",
}

__all__ = [
    "DEFAULT_WINDOW",
    "Chunk",
    "DistributedSampler",
    "HasShardSizes",
    "MixturePart",
    "MixtureSampler",
    "PassPiece",
    "Plan",
    "ShardSampler",
    "Topology",
    "all_plans",
    "build_plan",
    "distinct_per_batch",
    "stream_seed",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
