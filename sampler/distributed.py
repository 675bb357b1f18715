"""`DistributedSampler`: torch's, made to work without a process group."""

from __future__ import annotations

from typing import TypeVar

from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler as _TorchDistributedSampler

from .checks import IntLike, as_int
from .topology import Topology

__all__ = ["DistributedSampler"]

T_co = TypeVar("T_co", covariant=True)


class DistributedSampler(_TorchDistributedSampler[T_co]):
    """A drop-in for `torch.utils.data.distributed.DistributedSampler`.

    For the same arguments and epoch it yields exactly torch's indices and has torch's
    `len()`, because the index arithmetic *is* torch's (this class only chooses the
    defaults). The difference: when both `num_replicas` and `rank` are None and no
    process group is initialized, they come from torchrun's WORLD_SIZE / RANK variables,
    else 1 and 0, instead of raising; `num_replicas` > 1 without `rank` there still
    raises ValueError (every process would be rank 0). Numpy integers are taken as torch
    takes them (and stored as ints); bools, floats and other invalid values raise
    ValueError quoting them.
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        num_replicas: IntLike | None = None,
        rank: IntLike | None = None,
        shuffle: bool = True,
        seed: IntLike = 0,
        drop_last: bool = False,
    ) -> None:
        topo = Topology.resolve(num_replicas, rank)
        super().__init__(
            dataset,
            num_replicas=topo.world_size,
            rank=topo.rank,
            shuffle=shuffle,
            seed=as_int("seed", seed),
            drop_last=drop_last,
        )
