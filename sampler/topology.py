"""Who am I in the job: rank and world size, detected once, validated always."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from .checks import IntLike, as_int

__all__ = ["Topology"]


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={raw!r} is not an integer; "
            "torchrun sets it, so unset it or pass num_replicas/rank explicitly"
        ) from None


@dataclass(frozen=True)
class Topology:
    """A rank inside a world of `world_size` ranks; always 0 <= rank < world_size.

    Both are Python ints: numpy integers are converted (torch takes them too); bools,
    floats and other types raise ValueError quoting the value.
    """

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        world = as_int("num_replicas", self.world_size)
        rank = as_int("rank", self.rank)
        if world < 1:
            raise ValueError(f"num_replicas must be >= 1, got {world}")
        if not 0 <= rank < world:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {world - 1}] "
                f"(num_replicas={world})"
            )
        object.__setattr__(self, "world_size", world)
        object.__setattr__(self, "rank", rank)

    @classmethod
    def detect(cls) -> Topology:
        """The initialized process group's rank and size; else torchrun's RANK and
        WORLD_SIZE; else rank 0 of 1."""
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size())
        world, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
        return cls(rank=0 if rank is None else rank, world_size=1 if world is None else world)

    @classmethod
    def resolve(cls, num_replicas: IntLike | None = None, rank: IntLike | None = None) -> Topology:
        """Explicit values win; a None is filled from `detect()` (called at most once)."""
        if num_replicas is None or rank is None:
            found = cls.detect()
            num_replicas = found.world_size if num_replicas is None else num_replicas
            rank = found.rank if rank is None else rank
        return cls(rank=as_int("rank", rank), world_size=as_int("num_replicas", num_replicas))
