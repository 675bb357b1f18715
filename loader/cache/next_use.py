"""When a node reads each shard next: the future the node cache evicts by.

The plan is a pure function, so every process of a node can compute the plans of all the
node's ranks and workers, for this epoch and the next, without talking to them. Time is
measured in epochs: a piece is in use from when its block of interleaved pieces starts
(the share of its worker's plan read before it) to when that block ends; the node's
workers read at about the same pace, so the same share of each plan is read at about the
same time. `now` is how far this process's own plan has got (the last shard it fetched).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from shardstream.sampler.planning import all_plans, plan_intervals

from .files import shard_key

__all__ = ["NextUse"]


class NextUse:
    """The node's future reads: per shard, the intervals (in epochs from the start of the
    current one) its pieces are read in, by any rank and worker of the node, this epoch
    and the next. Later than that is "never" (infinity)."""

    def __init__(
        self,
        intervals: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, bool]],
        keys: dict[str, int],
    ) -> None:
        shards, starts, ends, own = [], [], [], []
        for s, a, b, mine in intervals:
            shards.append(s)
            starts.append(a)
            ends.append(b)
            own.append(np.full(s.size, mine))
        s = np.concatenate(shards) if shards else np.zeros(0, dtype=np.int64)
        a = np.concatenate(starts) if starts else np.zeros(0)
        b = np.concatenate(ends) if ends else np.zeros(0)
        o = np.concatenate(own) if own else np.zeros(0, dtype=bool)
        order = np.lexsort((a, s))
        self._shards, self._starts, self._ends, self._own = s[order], a[order], b[order], o[order]
        self._keys = keys
        self._lock = threading.Lock()
        self.now = 0.0

    @classmethod
    def of_node(
        cls,
        sizes: np.ndarray,
        names: Callable[[int], tuple[str, str | None]],
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        drop_last: bool,
        num_replicas: int,
        rank: int,
        node_ranks: Sequence[int],
        worker: int,
        num_workers: int,
        window: int,
        local_world_size: int | None = None,
    ) -> NextUse:
        """The future of the node holding `node_ranks`, seen by worker `worker` of `rank`,
        from the plans of this epoch and the next; `names(shard)` gives the (url, version)
        the cache's blocks of a shard are named by."""
        intervals = []
        seen: set[int] = set()
        for k, e in enumerate((epoch, epoch + 1)):
            plans = all_plans(
                sizes,
                seed=seed,
                epoch=e,
                shuffle=shuffle,
                drop_last=drop_last,
                num_replicas=num_replicas,
                num_workers=num_workers,
                window=window if shuffle else 1,
                local_world_size=local_world_size,
                ranks=node_ranks,
            )
            for r, w, plan in plans:
                s, a, b = plan_intervals(plan)
                seen.update(int(x) for x in np.unique(s))
                intervals.append((s, a + k, b + k, k == 0 and (r, w) == (rank, worker)))
        return cls(intervals, {shard_key(*names(i)): i for i in seen})

    def shard_of(self, key: str) -> int | None:
        """The shard a block file's key names, if the node reads it in the two epochs."""
        return self._keys.get(key)

    def _range(self, shard: int) -> tuple[int, int]:
        lo = int(np.searchsorted(self._shards, shard, side="left"))
        hi = int(np.searchsorted(self._shards, shard, side="right"))
        return lo, hi

    def reached(self, shard: int) -> None:
        """This process is reading `shard` now: `now` moves to its own next interval of
        it (never back)."""
        lo, hi = self._range(shard)
        with self._lock:
            now = self.now
            mine = self._own[lo:hi] & (self._ends[lo:hi] >= now)
            if mine.any():
                self.now = max(now, float(self._starts[lo:hi][mine].min()))

    def next_use(self, shards: Sequence[int], after: bool = False) -> list[float]:
        """Per shard, when the node reads it next (now, if a read of it is under way;
        `after`: the first read starting after now); infinity if not within the two
        epochs."""
        now = self.now
        out = []
        for shard in shards:
            lo, hi = self._range(shard)
            starts, ends = self._starts[lo:hi], self._ends[lo:hi]
            if after:
                later = starts[starts > now]
                out.append(float(later.min()) if later.size else float("inf"))
            else:
                live = ends >= now
                out.append(max(now, float(starts[live].min())) if live.any() else float("inf"))
        return out
