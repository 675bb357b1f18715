"""A mixture stream's passes as ShardSampler plans them, kept for reuse.

Pass p of stream k cut for R ranks is what ``ShardSampler(sizes_k, R, r, shuffle, seed_k,
drop_last, window)`` plans at epoch p; a rank's workers share its plans, so the latest are
kept (least recently used dropped first), and a pass's line only while its plans are made.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from ..epoch import EpochLine, rank_length
from ..plan import Groups, Plan
from ..planning import line_of, span_plan
from .passes import Cursor, cut_lengths, to_first_cut
from .read import PassPiece

__all__ = ["PassPlans"]

_LINES, _PLANS = 2, 256


class PassPlans:
    """The plans of the passes of a mixture's streams (`sizes`: each stream's shard sizes;
    `seeds`: each stream's seed; `groups`: each stream's read groups, or None)."""

    def __init__(
        self,
        sizes: Sequence[npt.NDArray[np.int64]],
        seeds: Sequence[int],
        shuffle: bool,
        drop_last: bool,
        window: int,
        groups: Sequence[Groups | None],
        local_world_size: int | None,
    ) -> None:
        self.sizes, self.seeds, self.groups = sizes, seeds, groups
        self.shuffle, self.drop_last, self.window = shuffle, drop_last, window
        self.local_world_size = local_world_size
        self.num_records = [int(s.sum()) for s in sizes]
        self._line_cache: OrderedDict[tuple[int, int, int], EpochLine] = OrderedDict()
        self._plan_cache: OrderedDict[tuple[int, int, int, int], Plan] = OrderedDict()

    def plan(self, k: int, pass_index: int, num_replicas: int, rank: int) -> Plan:
        """Rank `rank`'s plan of pass `pass_index` of stream k cut for `num_replicas`."""
        key = (k, pass_index, num_replicas, rank)
        if key in self._plan_cache:
            self._plan_cache.move_to_end(key)
            return self._plan_cache[key]
        line = self._line(k, pass_index, num_replicas)
        length = rank_length(self.num_records[k], num_replicas, self.drop_last)
        plan = span_plan(
            line,
            rank * length,
            (rank + 1) * length,
            seed=self.seeds[k],
            epoch=pass_index,
            shuffle=self.shuffle,
            window=self.window if self.shuffle else 1,
            groups=self.groups[k],
        )
        self._plan_cache[key] = plan
        if len(self._plan_cache) > _PLANS:
            self._plan_cache.popitem(last=False)
        return plan

    def _line(self, k: int, pass_index: int, num_replicas: int) -> EpochLine:
        """Stream k's line of a pass cut for `num_replicas` ranks: with locality, nodes of
        `local_world_size` keep their records (a cut for a number of ranks it does not
        divide, after an elastic resume, takes the global order for that pass)."""
        local = self.local_world_size
        if local is None or num_replicas % local:
            num_replicas = 0  # the global line serves every cut
        key = (k, pass_index, num_replicas)
        if key not in self._line_cache:
            self._line_cache[key] = line_of(
                self.sizes[k],
                self.seeds[k],
                pass_index,
                self.shuffle,
                self.drop_last,
                num_replicas,
                local if num_replicas else None,
            )
            if len(self._line_cache) > _LINES:
                self._line_cache.popitem(last=False)
        self._line_cache.move_to_end(key)
        return self._line_cache[key]

    def pieces(
        self, k: int, cursor: Cursor, num_replicas: int, rank: int, x0: int, x1: int
    ) -> Iterator[PassPiece]:
        """Records [x0, x1) of stream k's sequence counted from `cursor`, for `rank` of
        `num_replicas`, as pass pieces: the rest of the cursor's pass (as elastic resumes
        cut it), then fresh passes cut for `num_replicas`."""
        n = self.num_records[k]
        lengths = cut_lengths(n, self.drop_last, cursor)
        left = lengths[-1] - cursor.consumed  # records left in the current pass's span
        first = cursor.recut[0][0] if cursor.recut else cursor.num_replicas
        p, c = cursor.pass_index, cursor.consumed
        for r0, lo, hi in to_first_cut(lengths, cursor, rank, c + x0, c + min(x1, left)):
            yield PassPiece(k, p, first, r0, self.plan(k, p, first, r0), lo, hi)
        full = rank_length(n, num_replicas, self.drop_last)
        pos, end = max(0, x0 - left), x1 - left  # positions in the later, fresh passes
        while pos < end:
            q, offset = divmod(pos, full)
            take = min(end - pos, full - offset)
            plan = self.plan(k, p + 1 + q, num_replicas, rank)
            yield PassPiece(k, p + 1 + q, num_replicas, rank, plan, offset, offset + take)
            pos += take
