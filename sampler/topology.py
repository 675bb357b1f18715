"""Who am I in the job: rank and world size, detected once, validated always."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from .checks import IntLike, as_int

__all__ = ["Topology", "env_int"]


def env_int(name: str) -> int | None:
    """The integer environment variable `name` (torchrun's RANK, WORLD_SIZE, ...), None if
    unset or empty; ValueError naming it if it is not an integer."""
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


def _found() -> tuple[int | None, int | None]:
    """(world size, rank) of the initialized process group, else torchrun's WORLD_SIZE
    and RANK; None where neither says."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return env_int("WORLD_SIZE"), env_int("RANK")


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
        WORLD_SIZE; else rank 0 of 1. WORLD_SIZE > 1 without RANK raises ValueError
        (every process would take rank 0)."""
        world, rank = _found()
        if rank is None and world is not None and world != 1:
            raise ValueError(
                f"environment variable WORLD_SIZE={world} is set but RANK is not, so this "
                "process cannot know its rank; run under torchrun (it sets both) or pass "
                "num_replicas and rank explicitly"
            )
        return cls(rank=0 if rank is None else rank, world_size=1 if world is None else world)

    @classmethod
    def resolve(cls, num_replicas: IntLike | None = None, rank: IntLike | None = None) -> Topology:
        """Explicit values win; a None is filled from the process group or torchrun.

        `num_replicas` > 1 without `rank`, with no process group and no RANK variable,
        raises ValueError rather than making every process rank 0 (torch's sampler raises
        there too); both None there is rank 0 of 1.
        """
        if rank is not None:
            rank = as_int("rank", rank)
            if num_replicas is not None:
                return cls(rank=rank, world_size=as_int("num_replicas", num_replicas))
            found_world, _ = _found()
            return cls(rank=rank, world_size=1 if found_world is None else found_world)
        if num_replicas is None:
            return cls.detect()
        world = as_int("num_replicas", num_replicas)
        _, found_rank = _found()
        if found_rank is None and world != 1:
            raise ValueError(
                f"num_replicas={world} was given without rank, and no process group is "
                "initialized and RANK is not set, so every process would read rank 0's "
                f"records; pass rank=0..{world - 1} as well, or run under torchrun"
            )
        return cls(rank=0 if found_rank is None else found_rank, world_size=world)
