"""Pure planning: which records each rank and worker reads, in which order. No I/O."""

from .distributed import DistributedSampler
from .mixing import distinct_per_batch
from .mixture import MixturePart, MixtureSampler, PassPiece, stream_seed
from .plan import Chunk, Plan, all_plans, build_plan
from .shard_sampler import DEFAULT_WINDOW, HasShardSizes, ShardSampler
from .topology import Topology

__shardstream__ = True  # the shardstream package checks that `sampler` is this one

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
