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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from ..checks import IntLike
from ..epoch import rank_length, worker_span
from ..plan import Groups
from ..resume import phased_streams
from ..shard_sampler import DEFAULT_WINDOW, check_flag, check_groups
from ..topology import Topology
from .args import (
    Shards,
    check_names,
    check_schedule,
    check_streams,
    check_weights,
    stream_seed,
    stream_sizes,
)
from .passes import Cursor, advance, cut_lengths, recut, to_first_cut
from .phases import Phases, plan_phases
from .plans import PassPlans
from .read import MixturePart, PassPiece, merge_streams, piece_records
from .schedule import MAX_POSITIONS, name_ranks
from .state import cursor_state, load_cursors

__all__ = ["MixturePart", "MixtureSampler", "PassPiece", "stream_seed"]

I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Anchor:
    """An epoch whose start is known: cursors at its start and its phases' counts. Later
    epochs advance from it by closed form."""

    epoch: int
    cursors: tuple[Cursor, ...]
    phases: Phases


class MixtureSampler(Sampler[tuple[int, int]]):
    """Weighted mixture of streams of shards; yields ``(stream index, record id)``.

    Stream k's record ids are its shard offset + row, as ShardSampler yields. `groups`:
    per stream, its shards' read groups, as ShardSampler takes them. Every rank
    yields L = epoch_size // num_replicas records an epoch (`len()`), c_k of them from
    stream k, the same on every rank and epoch. Weights default to record counts, names to
    ``"stream{k}"``; stream seeds derive from `seed` and the names (`stream_seed`).

    `schedule`: weights that change along the epoch, ``[(E_1, w_1), (E_2, w_2), ...]`` with
    w_p one weight per stream (a list, or a dict by name: >= 0, one > 0) and sum E_p the
    epoch size (`sampler.mixture.phases`); instead of `weights`.
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
        schedule: Sequence[tuple[IntLike, Sequence[float] | Mapping[str, float]]] | None = None,
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
        if schedule is not None and weights is not None:
            raise ValueError("give weights or a schedule, not both")
        self.schedule = check_schedule(schedule, self.names, epoch_size)
        self.weights = check_weights(weights, self.num_records, self.names)
        total = sum(self.num_records) if epoch_size is None else epoch_size
        if self.schedule is not None:
            total = sum(e for e, _ in self.schedule)
        self.epoch_size = check_flag("epoch_size", total, 1)
        if self.schedule is None:  # fixed weights: one phase
            self.schedule = ((self.epoch_size, tuple(self.weights)),)
        else:
            self.weights = list(self.schedule[0][1])
        length = self.epoch_size // self.num_replicas
        if length < 1 or length >= MAX_POSITIONS:
            raise ValueError(
                f"epoch_size // num_replicas = {self.epoch_size} // {self.num_replicas} = "
                f"{length} records per rank; it must lie in [1, {MAX_POSITIONS})"
            )
        self._ranks = name_ranks(self.names)
        self.phase_items = tuple(int(e) for e, _ in self.schedule)
        self.phases = plan_phases(
            self.phase_items, [w for _, w in self.schedule], self.num_replicas, self._ranks
        )
        self.counts = self.phases.totals  # per stream, its positions in a fresh epoch
        self.seeds = tuple(stream_seed(self.seed, n) for n in self.names)
        # per stream, (S_k,) global id of each shard's first record
        self.offsets = [
            np.concatenate(([0], np.cumsum(s)))[:-1].astype(np.int64) for s in self.sizes
        ]
        fresh = tuple(Cursor(0, 0, self.num_replicas) for _ in self.sizes)
        self._anchor = _Anchor(0, fresh, self.phases)
        self.epoch = 0
        self._resume = self._yielded = 0
        self._passes = PassPlans(
            self.sizes,
            self.seeds,
            self.shuffle,
            self.drop_last,
            self.window,
            self.groups,
            self.local_world_size,
        )

    # --- the epoch --------------------------------------------------------------------

    def for_rank(self, num_replicas: int, rank: int) -> MixtureSampler:
        """The same mixture (streams, weights, epoch size, seed, ...) planned for `rank` of
        `num_replicas` ranks, at epoch 0: load a state into it to anchor its epochs."""
        return MixtureSampler(
            self.sizes,
            None,
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
            self.schedule,
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
        """(cursors at the epoch's start, the epoch's counts c_k over its phases)."""
        cursors, phases = self._epoch(epoch)
        return cursors, phases.totals

    def _epoch(self, epoch: int | None = None) -> tuple[tuple[Cursor, ...], Phases]:
        """(cursors at the epoch's start, its phases), in closed form: the anchor epoch's
        cursors advanced by its counts, then by `counts` per epoch."""
        e = self.epoch if epoch is None else check_flag("epoch", epoch, 0)
        a = self._anchor
        if e < a.epoch:
            raise ValueError(f"epoch {e} precedes epoch {a.epoch} of the loaded state")
        if e == a.epoch:
            return a.cursors, a.phases
        done = a.phases.totals
        cursors = tuple(
            advance(cur, done[k] + (e - a.epoch - 1) * self.counts[k], n, self.drop_last)
            for k, (cur, n) in enumerate(zip(a.cursors, self.num_records))
        )
        return cursors, self.phases

    def epoch_counts(self) -> tuple[int, ...]:
        """c_k of the current epoch (the rest's, after an elastic resume)."""
        return self.epoch_start()[1]

    def epoch_phases(self) -> Phases:
        """The current epoch's phases (the rest's, after an elastic resume)."""
        return self._epoch()[1]

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

    def worker_ranges(
        self, worker: int = 0, num_workers: int = 1, align: int = 1
    ) -> list[tuple[int, int]]:
        """Positions worker `worker` reads, phase by phase: each phase cut in
        `num_workers` contiguous parts at multiples of `align`, so that a DataLoader taking
        items from its workers in turn delivers phase 1, then phase 2, ... With one phase,
        ``[worker_range(...)]``."""
        self.worker_range(worker, num_workers, align)  # checks the arguments
        ends = self.epoch_phases().bounds
        segments = phased_streams(ends, 1, num_workers, align)[0][worker]
        return [(a, b) for _, _, a, b in segments]

    def worker_part(self, worker: int = 0, num_workers: int = 1, align: int = 1) -> MixturePart:
        """What worker `worker` reads: `part` of its `worker_range`."""
        return self.part(*self.worker_range(worker, num_workers, align))

    def part(self, start: int, stop: int) -> MixturePart:
        """Positions [start, stop) of the epoch: per stream, the pass pieces they read.

        Stream k reads records [n_k(start), n_k(stop)) of its slice of the epoch (n_k the
        schedule's counts), a contiguous range of its sequence from the epoch's cursor.
        """
        cursors, phases = self._epoch()
        if not 0 <= start <= stop <= len(phases):
            raise ValueError(f"need 0 <= start <= stop <= {len(phases)}, got {start}, {stop}")
        a = phases.before(self._ranks, start)
        b = phases.before(self._ranks, stop)
        pieces = tuple(tuple(self._pieces(k, cursors[k], a[k], b[k])) for k in range(len(a)))
        return MixturePart(self.epoch, start, stop, tuple(a), pieces)

    def stream_ids(self, start: int = 0, stop: int | None = None) -> Iterator[I64Array]:
        """Chunks (int64 arrays) of the stream index at each position in [start, stop)."""
        phases = self.epoch_phases()
        return phases.stream_ids(self._ranks, start, len(phases) if stop is None else stop)

    def _pieces(self, k: int, cursor: Cursor, x0: int, x1: int) -> Iterator[PassPiece]:
        """Records [x0, x1) of stream k's sequence counted from `cursor`, as pass pieces."""
        n = self.num_records[k]
        lengths = cut_lengths(n, self.drop_last, cursor)
        left = lengths[-1] - cursor.consumed  # records left in the current pass's span
        first = cursor.recut[0][0] if cursor.recut else cursor.num_replicas
        p, c = cursor.pass_index, cursor.consumed
        for r0, lo, hi in to_first_cut(lengths, cursor, self.rank, c + x0, c + min(x1, left)):
            yield PassPiece(k, p, first, r0, self._passes.plan(k, p, first, r0), lo, hi)
        full = rank_length(n, self.num_replicas, self.drop_last)
        pos, end = max(0, x0 - left), x1 - left  # positions in the later, fresh passes
        while pos < end:
            q, offset = divmod(pos, full)
            take = min(end - pos, full - offset)
            plan = self._passes.plan(k, p + 1 + q, self.num_replicas, self.rank)
            yield PassPiece(k, p + 1 + q, self.num_replicas, self.rank, plan, offset, offset + take)
            pos += take

    # --- records ----------------------------------------------------------------------

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[I64Array, I64Array]]:
        """Chunks of (stream index, record id) arrays for positions [start, stop), merged
        by the schedule from each stream's pass pieces; nothing before `start` is made."""
        stop = len(self) if stop is None else stop
        cursors, phases = self._epoch()
        a = phases.before(self._ranks, start)
        b = phases.before(self._ranks, stop)
        streams = [
            piece_records(self._pieces(k, cursors[k], a[k], b[k]), self.offsets[k])
            for k in range(len(cursors))
        ]
        return merge_streams(phases.stream_ids(self._ranks, start, stop), streams)

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
        plus ``"recut"`` when the pass was recut by elastic resumes and ``"phases"`` (c_k
        in each phase) in an epoch of several phases. The state is the same on every rank
        of a job that yielded the same number of records.
        """
        cursors, phases = self._epoch()
        streams = {
            n: cursor_state(c, m, [p[k] for p in phases.counts])
            for k, (n, c, m) in enumerate(zip(self.names, cursors, phases.totals))
        }
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
        self._anchor = _Anchor(epoch, cursors, self.phases)
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
        new rank, phase by phase (`Phases.rest`: a phase ends at ``R_old * (B_p - position)
        // R_new``), each apportioned by the counts the old ranks had left of it (largest
        remainder) and stratified on its own. Position then counts from 0, the state's
        counts are the rest's, so a state saved later resumes, elastically or not, like
        any other.
        Nothing is replayed; a pass recut several times keeps each layout in "recut".
        """
        epoch, position, cursors, phases = load_cursors(
            state, self.names, self.num_records, self.drop_last
        )
        old = cursors[0].num_replicas
        if old != self.num_replicas:
            held = phases.before(self._ranks, position)
            cursors = tuple(
                recut(advance(c, h, n, self.drop_last), self.num_replicas, n, self.drop_last)
                for c, h, n in zip(cursors, held, self.num_records)
            )
            phases = phases.rest(self._ranks, position, old, self.num_replicas)
            position = 0
        self._anchor = _Anchor(epoch, cursors, phases)
        self.epoch, self._resume, self._yielded = epoch, position, position
