"""`ShardSampler`: DistributedSampler's contract, planned over shards instead of records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from .checks import IntLike, as_int
from .epoch import rank_length, worker_span
from .plan import DEFAULT_WINDOW, Groups, Plan
from .planning import all_plans, build_plan
from .topology import Topology

__all__ = [
    "DEFAULT_WINDOW",
    "HasShardSizes",
    "ShardSampler",
    "check_flag",
    "check_groups",
    "sizes_of",
]


@runtime_checkable
class HasShardSizes(Protocol):
    """Anything that knows how many records each of its shards holds (a ShardIndex)."""

    @property
    def shard_sizes(self) -> Sequence[int] | npt.NDArray[np.int64]: ...


def sizes_of(shards: Sequence[int] | HasShardSizes | npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Records per shard as an int64 array (from a list, an array or a ShardIndex), checked:
    ValueError naming the first negative or non-integer size."""
    raw = shards.shard_sizes if isinstance(shards, HasShardSizes) else shards
    arr = np.asarray(raw)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            "shards must be a 1-D sequence of record counts (ints) or an object with "
            f"`shard_sizes`, got {type(shards).__name__} of dtype {arr.dtype}, shape {arr.shape}"
        )
    sizes = arr.astype(np.int64)
    if sizes.size and sizes.min() < 0:
        bad = int(np.argmin(sizes))
        raise ValueError(f"shard {bad} has {sizes[bad]} records; counts must be >= 0")
    return sizes


def _check_counts(s: int, counts: Sequence[int], size: int) -> None:
    if sum(counts) != size or any(int(c) <= 0 for c in counts):
        raise ValueError(
            f"groups of shard {s} must be positive record counts summing to its {size} "
            f"records, got {list(counts)[:8]}{'...' if len(counts) > 8 else ''}"
        )


class _Checked(Sequence[Sequence[int]]):
    """Groups given as a lazy sequence (an index of a million shards computes a shard's
    groups when a plan reads it): each shard's checked when first asked for."""

    def __init__(self, groups: Groups, sizes: npt.NDArray[np.int64]) -> None:
        self.groups, self.sizes = groups, sizes

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, s: int) -> Sequence[int]:  # type: ignore[override]
        counts = self.groups[s]
        _check_counts(s, counts, int(self.sizes[s]))
        return counts


def check_groups(groups: Groups | None, sizes: npt.NDArray[np.int64]) -> Groups | None:
    """The groups, checked: one list per shard, positive counts summing to its size (a
    list or tuple now, any other sequence a shard at a time, as the plans ask)."""
    if groups is None:
        return None
    if len(groups) != sizes.size:
        raise ValueError(f"groups gives {len(groups)} shards, the sizes {sizes.size}")
    if not isinstance(groups, list | tuple):
        return _Checked(groups, sizes)
    for s, (counts, size) in enumerate(zip(groups, sizes.tolist())):
        _check_counts(s, counts, size)
    return groups


def check_flag(name: str, value: object, minimum: int) -> int:
    """`value` as an int >= `minimum` (sampler.checks.as_int: ValueError naming `name`)."""
    return as_int(name, value, minimum)


class ShardSampler(Sampler[int]):
    """Assigns records of a sharded dataset to ranks, shard-aware, as DistributedSampler does.

    Each epoch the shard order is shuffled (keyed by seed and epoch), the records laid end to
    end in that order are cut into `num_replicas` contiguous spans of exactly ``len(self)``
    records (padding by wrapping to the start, or dropping the tail with `drop_last`, as
    torch does), and each rank reads only its span. A shard cut between two ranks is cut
    along its storage order, so every rank's part of a shard is a contiguous row range; only
    then is each part shuffled inside (keyed by seed, epoch, shard and first row), and
    `window` consecutive parts are interleaved so neighbouring records come from different
    shards. With ``shuffle=False`` the order is plain storage order, without interleaving.

    `local_world_size` (ranks per node; ``locality="node"`` of the dataset): epoch 0's
    spans of each node's ranks are kept by that node every epoch, each epoch reshuffling
    shard order and in-shard order inside them (sampler.epoch.node_line); the counts per
    rank and the exactly-once rule hold as without it.

    `groups` (optional, per shard the record counts of its groups, summing to its size)
    tells where a reader's decode units lie (Parquet row groups): a part holding several
    groups is then shuffled group by group (the groups in a keyed order, each group's rows
    in a keyed permutation), so a reader holds one group of each interleaved part at a
    time. Without it each part is one keyed permutation of all its rows.

    Iterating yields global record ids (shard offset + row), so the sampler also serves as
    ``sampler=`` of a map-style dataset. `plan()` gives the reading plan a loader needs.
    Planning costs O(shards): no permutation of all records is ever built.
    """

    def __init__(
        self,
        shards: Sequence[int] | HasShardSizes | npt.ArrayLike,
        num_replicas: IntLike | None = None,
        rank: IntLike | None = None,
        shuffle: bool = True,
        seed: IntLike = 0,
        drop_last: bool = False,
        window: IntLike = DEFAULT_WINDOW,
        groups: Groups | None = None,
        local_world_size: IntLike | None = None,
    ) -> None:
        self.sizes = sizes_of(shards)
        self.groups = check_groups(groups, self.sizes)
        topo = Topology.resolve(num_replicas, rank)
        self.num_replicas, self.rank = topo.world_size, topo.rank
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = check_flag("seed", seed, -(2**63))
        self.window = check_flag("window", window, 1)
        self.local_world_size = (
            None
            if local_world_size is None
            else check_flag("local_world_size", local_world_size, 1)
        )
        if self.local_world_size is not None and self.num_replicas % self.local_world_size:
            raise ValueError(
                f"local_world_size={self.local_world_size} must divide num_replicas="
                f"{self.num_replicas}: nodes of equal size (locality='node')"
            )
        # (S,) global id of each shard's first record
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes)))[:-1].astype(np.int64)
        self.num_records = int(self.sizes.sum())
        self.epoch = 0
        self._resume = 0  # where the next __iter__ starts (set by load_state_dict)
        self._yielded = 0  # records yielded by the current iterator, from its start of epoch

    def set_epoch(self, epoch: IntLike) -> None:
        """Select the epoch's order. A different epoch drops a pending resume position."""
        epoch = check_flag("epoch", epoch, 0)
        if epoch != self.epoch:
            self._resume = self._yielded = 0
        self.epoch = epoch

    def __len__(self) -> int:
        return rank_length(self.num_records, self.num_replicas, self.drop_last)

    def plan(self, worker: int = 0, num_workers: int = 1, align: int = 1) -> Plan:
        """This rank's reading plan for the current epoch, or worker `worker`'s part of it.

        The workers' plans cut the rank's span in `num_workers` contiguous parts of near-equal
        size: together they hold exactly the rank's records (their order within the rank
        depends on num_workers, since each part is shuffled and interleaved on its own).
        With `align` (a batch size), every cut falls on a multiple of `align` records, so
        only the last worker's last batch can be short.
        """
        num_workers = check_flag("num_workers", num_workers, 1)
        align = check_flag("align", align, 1)
        if not 0 <= check_flag("worker", worker, 0) < num_workers:
            raise ValueError(f"worker must lie in [0, {num_workers - 1}], got {worker}")
        return build_plan(
            self.sizes,
            rank=self.rank,
            worker=worker,
            num_workers=num_workers,
            align=align,
            **self._settings(),
        )

    def all_plans(self, num_workers: int = 1) -> Iterator[tuple[int, int, Plan]]:
        """(rank, worker, plan) for every rank of the job and every worker, as each would
        compute it for the current epoch; the epoch's shard order is computed only once."""
        workers = check_flag("num_workers", num_workers, 1)
        return all_plans(self.sizes, num_workers=workers, **self._settings())

    def _settings(self) -> dict[str, Any]:
        """The planning arguments every rank of the job shares."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "num_replicas": self.num_replicas,
            "window": self.window if self.shuffle else 1,
            "groups": self.groups,
            "local_world_size": self.local_world_size,
        }

    def worker_lengths(self, num_workers: int = 1, align: int = 1) -> list[int]:
        """Records in each worker's plan, `plan(w, num_workers, align)`, without planning."""
        num_workers = check_flag("num_workers", num_workers, 1)
        align = check_flag("align", align, 1)
        spans = [worker_span(0, len(self), w, num_workers, align) for w in range(num_workers)]
        return [hi - lo for lo, hi in spans]

    def __iter__(self) -> Iterator[int]:
        start, self._resume = self._resume, 0
        self._yielded = start
        for chunk in self.plan().chunks(start):
            for record in (self.offsets[chunk.shards] + chunk.rows).tolist():
                self._yielded += 1
                yield record

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "position"}: position counts records the current iterator has yielded."""
        return {"epoch": self.epoch, "position": self._yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue an epoch: the next iteration yields exactly the records after `position`."""
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise ValueError(f"state lacks {sorted(missing)}; expected keys epoch and position")
        epoch = check_flag("state['epoch']", state["epoch"], 0)
        position = check_flag("state['position']", state["position"], 0)
        if position > len(self):
            raise ValueError(
                f"state['position']={position} exceeds the epoch's {len(self)} records"
            )
        self.epoch, self._resume, self._yielded = epoch, position, position
