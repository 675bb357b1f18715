"""Which rank a dataset reads for, when the process group comes after the dataset.

A dataset built before ``init_process_group`` (``torch.multiprocessing.spawn`` workers,
Lightning's ``LightningDataModule.__init__``, a script that builds its data first) finds no
group and, without torchrun's variables, would read everything as rank 0 of 1 on every
rank. So the rank and world size found without a group are provisional: the dataset asks
again (`Ranks.settle`) each time it is sized, iterated, saved or pickled for a DataLoader
worker, and once a group is initialized takes the group's rank and world size, replanning
(the plan is a pure function of them: nothing was read yet that the new plan contradicts).
Explicit ``num_replicas`` and ``rank`` are final, and so is what a group said at
construction.
"""

from __future__ import annotations

import torch.distributed as dist

from shardstream.sampler import Topology
from shardstream.sampler.checks import IntLike

__all__ = ["Ranks"]

_LATER = (
    "; or, if this process joins a process group later, iterate the dataset (or take its "
    "len) after init_process_group: it then takes the group's rank and world size"
)


def _group() -> bool:
    """Whether this process is in an initialized default process group."""
    return dist.is_available() and dist.is_initialized()


class Ranks:
    """The `num_replicas` and `rank` a dataset was given, and the topology they resolve
    to now (`topology`). Provisional until a process group is found or both were given:
    a resolution that failed for want of a group (``WORLD_SIZE`` set without ``RANK``, as
    Lightning's launcher leaves it until the group starts) is kept as `pending` and raised
    only where the rank is needed and no group has come."""

    def __init__(self, num_replicas: IntLike | None, rank: IntLike | None) -> None:
        self.args = (num_replicas, rank)
        self.final = (num_replicas is not None and rank is not None) or _group()
        self.pending: str | None = None
        try:
            self.topology = Topology.resolve(num_replicas, rank)
        except ValueError as e:
            if self.final:
                raise
            self.topology, self.pending = Topology(rank=0, world_size=1), str(e)

    def settle(self, strict: bool) -> Topology | None:
        """The group's topology if it differs from the one the dataset planned with (the
        dataset then replans with it); None when nothing changed. `strict`: with no group
        yet, a pending error (no rank to be had) is raised now, as ValueError."""
        if self.final:
            return None
        if not _group():
            if strict and self.pending is not None:
                raise ValueError(self.pending + _LATER)
            return None
        topo = Topology.resolve(*self.args)
        self.final, self.pending = True, None
        if topo == self.topology:
            return None
        self.topology = topo
        return topo
