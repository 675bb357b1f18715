"""`MixtureSampler`: a weighted mixture of sharded streams, planned per rank and worker.

Per epoch every rank reads L = epoch_size // num_replicas positions; stream k holds c_k of
them (`sampler.mixture.schedule.apportion`), spread by the stratified schedule
(`sampler.mixture.schedule.stream_ids`). Stream k is read as an endless run of passes, pass p
being exactly what ``ShardSampler(sizes_k, R, r, shuffle, seed_k, drop_last, window)``
plans at epoch p; a rank's stream-k sequence is its span of pass 0, then of pass 1, ...,
and each epoch takes the next c_k records of it (`sampler.mixture.passes`). So no record of a
stream repeats within its pass (across ranks, with drop_last), a small stream is
upsampled by whole fresh passes, and a large one continues across epochs.

State is a few JSON integers: the epoch, the position in it, and per stream (by name) the
cursor at the epoch's start and the epoch's count c_k (see `MixtureSampler.state_dict`).
Planning and seeking cost O(streams x shards + pieces), never O(records).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from ..checks import IntLike
from ..epoch import EpochLine, rank_length, worker_span
from ..plan import Groups, Plan
from ..planning import line_of, span_plan
from ..shard_sampler import DEFAULT_WINDOW, check_flag, check_groups
from ..topology import Topology
from .args import (
    Shards,
    check_names,
    check_streams,
    check_weights,
    stream_seed,
    stream_sizes,
)
from .passes import Cursor, advance, cut_lengths, recut, to_first_cut
from .read import MixturePart, PassPiece, merge_streams, piece_records
from .schedule import MAX_POSITIONS, apportion, counts_before, name_ranks, stream_ids
from .state import cursor_state, load_cursors

__all__ = ["MixturePart", "MixtureSampler", "PassPiece", "stream_seed"]

I64Array = npt.NDArray[np.int64]
# epoch lines and plans kept for reuse, least recently used dropped first: the workers of
# a rank share its plans, and a plan needs its pass's line only while it is built
_LINES, _PLANS = 2, 256


@dataclass(frozen=True)
class _Anchor:
    """An epoch whose start is known: cursors at its start and its counts. Later epochs
    advance from it by closed form."""

    epoch: int
    cursors: tuple[Cursor, ...]
    counts: tuple[int, ...]


class MixtureSampler(Sampler[tuple[int, int]]):
    """Weighted mixture of streams of shards; yields ``(stream index, record id)``.

    Stream k's record ids are its shard offset + row, as ShardSampler yields. `groups`:
    per stream, its shards' read groups, as ShardSampler takes them. Every rank
    yields L = epoch_size // num_replicas records an epoch (`len()`), c_k of them from
    stream k, the same on every rank and epoch. Weights default to record counts, names to
    ``"stream{k}"``; stream seeds derive from `seed` and the names (`stream_seed`).
    """

    def __init__(
        self,
        streams: Sequence[Shards],
        weights: Sequence[float] | None = None,
        epoch_size: IntLike | None = None,
        num_replicas: IntLike | None = None,
        rank: IntLike | None = None,
        shuffle: bool = True,
        seed: IntLike = 0,
        drop_last: bool = False,
        window: IntLike = DEFAULT_WINDOW,
        names: Sequence[str] | None = None,
        groups: Sequence[Groups | None] | None = None,
        local_world_size: IntLike | None = None,
    ) -> None:
        if isinstance(streams, str | bytes) or len(streams) == 0:
            raise ValueError(f"a mixture needs at least one stream, got {streams!r}")
        self.names = check_names(names, len(streams))
        self.sizes = [stream_sizes(s, n) for s, n in zip(streams, self.names)]
        topo = Topology.resolve(num_replicas, rank)
        self.num_replicas, self.rank = topo.world_size, topo.rank
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.seed = check_flag("seed", seed, -(2**63))
        self.window = check_flag("window", window, 1)
        # locality="node", per stream: each stream's passes keep each node's records
        self.local_world_size = (
            None
            if local_world_size is None
            else check_flag("local_world_size", local_world_size, 1)
        )
        self.num_records = [int(s.sum()) for s in self.sizes]
        if groups is not None and len(groups) != len(self.sizes):
            raise ValueError(f"groups gives {len(groups)} streams, there are {len(self.sizes)}")
        # per stream, its shards' read groups (see sampler.plan), or None
        self.groups = [
            check_groups(g, s) for g, s in zip(groups or [None] * len(self.sizes), self.sizes)
        ]
        check_streams(self.names, self.num_records, self.num_replicas, self.drop_last)
        self.weights = check_weights(weights, self.num_records, self.names)
        total = sum(self.num_records) if epoch_size is None else epoch_size
        self.epoch_size = check_flag("epoch_size", total, 1)
        length = self.epoch_size // self.num_replicas
        if length < 1 or length >= MAX_POSITIONS:
            raise ValueError(
                f"epoch_size // num_replicas = {self.epoch_size} // {self.num_replicas} = "
                f"{length} records per rank; it must lie in [1, {MAX_POSITIONS})"
            )
        self._ranks = name_ranks(self.names)
        self.counts = tuple(apportion(length, self.weights, self._ranks))
        self.seeds = tuple(stream_seed(self.seed, n) for n in self.names)
        # per stream, (S_k,) global id of each shard's first record
        self.offsets = [
            np.concatenate(([0], np.cumsum(s)))[:-1].astype(np.int64) for s in self.sizes
        ]
        fresh = tuple(Cursor(0, 0, self.num_replicas) for _ in self.sizes)
        self._anchor = _Anchor(0, fresh, self.counts)
        self.epoch = 0
        self._resume = self._yielded = 0
        self._lines: OrderedDict[tuple[int, int, int], EpochLine] = OrderedDict()
        self._plans: OrderedDict[tuple[int, int, int, int], Plan] = OrderedDict()

    # --- the epoch --------------------------------------------------------------------

    def for_rank(self, num_replicas: int, rank: int) -> MixtureSampler:
        """The same mixture (streams, weights, epoch size, seed, ...) planned for `rank` of
        `num_replicas` ranks, at epoch 0: load a state into it to anchor its epochs."""
        return MixtureSampler(
            self.sizes,
            self.weights,
            self.epoch_size,
            num_replicas,
            rank,
            self.shuffle,
            self.seed,
            self.drop_last,
            self.window,
            self.names,
            self.groups,
            self.local_world_size,
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch. A different epoch drops a pending resume position; an epoch
        before the one a state was loaded for cannot be planned (its start is unknown)."""
        epoch = check_flag("epoch", epoch, 0)
        self.epoch_start(epoch)  # refuses an epoch before the loaded one
        if epoch != self.epoch:
            self._resume = self._yielded = 0
        self.epoch = epoch

    def epoch_start(self, epoch: int | None = None) -> tuple[tuple[Cursor, ...], tuple[int, ...]]:
        """(cursors at the epoch's start, the epoch's counts c_k), in closed form: the
        anchor epoch's cursors advanced by its counts, then by `counts` per epoch."""
        e = self.epoch if epoch is None else check_flag("epoch", epoch, 0)
        a = self._anchor
        if e < a.epoch:
            raise ValueError(f"epoch {e} precedes epoch {a.epoch} of the loaded state")
        if e == a.epoch:
            return a.cursors, a.counts
        cursors = tuple(
            advance(cur, a.counts[k] + (e - a.epoch - 1) * self.counts[k], n, self.drop_last)
            for k, (cur, n) in enumerate(zip(a.cursors, self.num_records))
        )
        return cursors, self.counts

    def epoch_counts(self) -> tuple[int, ...]:
        """c_k of the current epoch (the rest's, after an elastic resume)."""
        return self.epoch_start()[1]

    def __len__(self) -> int:
        """Positions of the current epoch: L (after an elastic resume, the rest's length)."""
        return sum(self.epoch_counts())

    @property
    def pass_lengths(self) -> list[int]:
        """Per stream, records of a fresh pass each rank reads (its span)."""
        return [rank_length(n, self.num_replicas, self.drop_last) for n in self.num_records]

    # --- plans ------------------------------------------------------------------------

    def worker_range(
        self, worker: int = 0, num_workers: int = 1, align: int = 1
    ) -> tuple[int, int]:
        """Positions [lo, hi) of worker `worker`: the epoch cut in `num_workers` contiguous
        parts at multiples of `align` (a batch size), as `worker_span` cuts a span."""
        num_workers = check_flag("num_workers", num_workers, 1)
        align = check_flag("align", align, 1)
        if not 0 <= check_flag("worker", worker, 0) < num_workers:
            raise ValueError(f"worker must lie in [0, {num_workers - 1}], got {worker}")
        return worker_span(0, len(self), worker, num_workers, align)

    def worker_part(self, worker: int = 0, num_workers: int = 1, align: int = 1) -> MixturePart:
        """What worker `worker` reads: `part` of its `worker_range`."""
        return self.part(*self.worker_range(worker, num_workers, align))

    def part(self, start: int, stop: int) -> MixturePart:
        """Positions [start, stop) of the epoch: per stream, the pass pieces they read.

        Stream k reads records [n_k(start), n_k(stop)) of its slice of the epoch (n_k the
        schedule's counts), a contiguous range of its sequence from the epoch's cursor.
        """
        cursors, counts = self.epoch_start()
        if not 0 <= start <= stop <= sum(counts):
            raise ValueError(f"need 0 <= start <= stop <= {sum(counts)}, got {start}, {stop}")
        a = counts_before(counts, self._ranks, start)
        b = counts_before(counts, self._ranks, stop)
        pieces = tuple(tuple(self._pieces(k, cursors[k], a[k], b[k])) for k in range(len(a)))
        return MixturePart(self.epoch, start, stop, tuple(a), pieces)

    def stream_ids(self, start: int = 0, stop: int | None = None) -> Iterator[I64Array]:
        """Chunks (int64 arrays) of the stream index at each position in [start, stop)."""
        counts = self.epoch_counts()
        return stream_ids(counts, self._ranks, start, sum(counts) if stop is None else stop)

    def _pieces(self, k: int, cursor: Cursor, x0: int, x1: int) -> Iterator[PassPiece]:
        """Records [x0, x1) of stream k's sequence counted from `cursor`, as pass pieces."""
        n = self.num_records[k]
        lengths = cut_lengths(n, self.drop_last, cursor)
        left = lengths[-1] - cursor.consumed  # records left in the current pass's span
        first = cursor.recut[0][0] if cursor.recut else cursor.num_replicas
        p, c = cursor.pass_index, cursor.consumed
        for r0, lo, hi in to_first_cut(lengths, cursor, self.rank, c + x0, c + min(x1, left)):
            yield PassPiece(k, p, first, r0, self._plan(k, p, first, r0), lo, hi)
        full = rank_length(n, self.num_replicas, self.drop_last)
        pos, end = max(0, x0 - left), x1 - left  # positions in the later, fresh passes
        while pos < end:
            q, offset = divmod(pos, full)
            take = min(end - pos, full - offset)
            plan = self._plan(k, p + 1 + q, self.num_replicas, self.rank)
            yield PassPiece(k, p + 1 + q, self.num_replicas, self.rank, plan, offset, offset + take)
            pos += take

    def _plan(self, k: int, pass_index: int, num_replicas: int, rank: int) -> Plan:
        """Rank `rank`'s plan of pass `pass_index` of stream k cut for `num_replicas`."""
        key = (k, pass_index, num_replicas, rank)
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
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
        self._plans[key] = plan
        if len(self._plans) > _PLANS:
            self._plans.popitem(last=False)
        return plan

    def _line(self, k: int, pass_index: int, num_replicas: int) -> EpochLine:
        """Stream k's line of a pass cut for `num_replicas` ranks: with locality, nodes of
        `local_world_size` keep their records (a cut for a number of ranks it does not
        divide, after an elastic resume, takes the global order for that pass)."""
        local = self.local_world_size
        if local is None or num_replicas % local:
            num_replicas = 0  # the global line serves every cut
        key = (k, pass_index, num_replicas)
        if key not in self._lines:
            self._lines[key] = line_of(
                self.sizes[k],
                self.seeds[k],
                pass_index,
                self.shuffle,
                self.drop_last,
                num_replicas,
                local if num_replicas else None,
            )
            if len(self._lines) > _LINES:
                self._lines.popitem(last=False)
        self._lines.move_to_end(key)
        return self._lines[key]

    # --- records ----------------------------------------------------------------------

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[I64Array, I64Array]]:
        """Chunks of (stream index, record id) arrays for positions [start, stop), merged
        by the schedule from each stream's pass pieces; nothing before `start` is made."""
        stop = len(self) if stop is None else stop
        cursors, counts = self.epoch_start()
        a = counts_before(counts, self._ranks, start)
        b = counts_before(counts, self._ranks, stop)
        streams = [
            piece_records(self._pieces(k, cursors[k], a[k], b[k]), self.offsets[k])
            for k in range(len(counts))
        ]
        return merge_streams(stream_ids(counts, self._ranks, start, stop), streams)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        start, self._resume = self._resume, 0
        self._yielded = start
        for ids, records in self.read(start):
            for pair in zip(ids.tolist(), records.tolist()):
                self._yielded += 1
                yield pair

    # --- state ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", "streams": {name: cursor}}``, JSON integers only.

        `position`: records of the current epoch yielded (counted from an elastic resume,
        see `load_state_dict`). Each stream's cursor is where this rank stood at the epoch's
        start: ``{"pass", "consumed", "num_replicas", "count"}`` (count: the epoch's c_k),
        plus ``"recut"`` when the pass was recut by elastic resumes. The state is the same
        on every rank of a job that yielded the same number of records.
        """
        cursors, counts = self.epoch_start()
        streams = {n: cursor_state(c, m) for n, c, m in zip(self.names, cursors, counts)}
        return {"epoch": self.epoch, "position": self._yielded, "streams": streams}

    def begin_epoch(self, epoch: int, streams: Mapping[str, Any]) -> None:
        """Plan epoch `epoch` as a fresh epoch of this layout (this sampler's counts,
        position 0) that starts where `streams` say each stream stands, as
        ``state_dict()["streams"]`` gives them. Cursors cut for another number of ranks
        (the layout an elastic resume left) are recut for this sampler's ranks: the rest
        of each stream's current pass laid end to end and cut anew (`sampler.mixture.passes.recut`).
        """
        epoch = check_flag("epoch", epoch, 0)
        state = {"epoch": epoch, "position": 0, "streams": streams}
        _, _, cursors, _ = load_cursors(state, self.names, self.num_records, self.drop_last)
        cursors = tuple(
            c
            if c.num_replicas == self.num_replicas
            else recut(c, self.num_replicas, n, self.drop_last)
            for c, n in zip(cursors, self.num_records)
        )
        self._anchor = _Anchor(epoch, cursors, self.counts)
        self.epoch, self._resume, self._yielded = epoch, 0, 0

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a state; the next iteration yields exactly what follows it.

        Same number of ranks: the epoch goes on with the saved counts (even if the weights
        changed; new weights count from the next epoch), and only then the new ones.

        Another number of ranks (elastic): the epoch's rest is planned anew for the new
        layout, as an epoch of its own. Every old rank had read the same records of each
        stream; each stream's cursor moves past them, and the rest of its current pass is
        cut over the new ranks (`sampler.mixture.passes.recut`; later passes are cut for them
        afresh). The rest of the epoch is ``R_old * (L - position) // R_new`` positions per
        new rank, apportioned by the counts the old ranks had left (largest remainder) and
        stratified on its own. Position then counts from 0, the state's counts are the
        rest's, so a state saved later resumes, elastically or not, like any other.
        Nothing is replayed; a pass recut several times keeps each layout in "recut".
        """
        epoch, position, cursors, counts = load_cursors(
            state, self.names, self.num_records, self.drop_last
        )
        old = cursors[0].num_replicas
        if old != self.num_replicas:
            held = counts_before(counts, self._ranks, position)
            cursors = tuple(
                recut(advance(c, h, n, self.drop_last), self.num_replicas, n, self.drop_last)
                for c, h, n in zip(cursors, held, self.num_records)
            )
            rest = [c - h for c, h in zip(counts, held)]
            length = old * (sum(counts) - position) // self.num_replicas
            counts = tuple(apportion(length, rest, self._ranks))
            position = 0
        self._anchor = _Anchor(epoch, cursors, counts)
        self.epoch, self._resume, self._yielded = epoch, position, position
