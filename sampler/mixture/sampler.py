"""`MixtureSampler`: a weighted mixture of sharded streams, planned per rank and worker.

Per epoch every rank reads L = epoch_size // num_replicas positions; stream k holds c_k of
them (`sampler.mixture.schedule.apportion`), spread by the stratified schedule
(`sampler.mixture.schedule.stream_ids`). Stream k is read as an endless run of passes, pass p
being exactly what ``ShardSampler(sizes_k, R, r, shuffle, seed_k, drop_last, window)``
plans at epoch p; a rank's stream-k sequence is its span of pass 0, then of pass 1, ...,
and each epoch takes the next c_k records of it (`sampler.mixture.passes`). So no record of a
stream repeats within its pass (across ranks, with drop_last), a small stream is
upsampled by whole fresh passes, and a large one continues across epochs.

A `schedule` splits the epoch into phases, each with its own counts and stratified
schedule (`sampler.mixture.phases`); the streams' sequences run on across them. A state
loaded under another schedule goes on under it from the next record
(`sampler.mixture.reweight`).

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
    schedule_key,
    stream_seed,
    stream_sizes,
)
from .passes import Cursor, advance, recut
from .phases import Phases, plan_phases
from .plans import PassPlans
from .read import MixturePart, PassPiece, merge_streams, piece_records
from .reweight import IDENTITY, Map, after_epochs, reweigh, through
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
    maps: tuple[Map, ...] = ()  # per stream, what the epoch reads (sampler.mixture.reweight)


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
        phased = check_schedule(schedule, self.names, epoch_size)
        self.weights = check_weights(weights, self.num_records, self.names)
        total = sum(self.num_records) if epoch_size is None else epoch_size
        if phased is not None:
            total = sum(e for e, _ in phased)
            self.weights = list(phased[0][1])
        self.epoch_size = check_flag("epoch_size", total, 1)
        # fixed weights: one phase
        self.schedule = phased or ((self.epoch_size, tuple(self.weights)),)
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
        self.schedule_key = schedule_key(self.schedule, self.names)
        self.seeds = tuple(stream_seed(self.seed, n) for n in self.names)
        # per stream, (S_k,) global id of each shard's first record
        self.offsets = [
            np.concatenate(([0], np.cumsum(s)))[:-1].astype(np.int64) for s in self.sizes
        ]
        fresh = tuple(Cursor(0, 0, self.num_replicas) for _ in self.sizes)
        self._anchor = _Anchor(0, fresh, self.phases)
        self.epoch = 0
        self._resume = self._yielded = 0
        self._passes = PassPlans(self.sizes, self.seeds, self.shuffle, self.drop_last,
                                 self.window, self.groups, self.local_world_size)  # fmt: skip

    # --- the epoch --------------------------------------------------------------------

    def for_rank(self, num_replicas: int, rank: int) -> MixtureSampler:
        """The same mixture (streams, weights, epoch size, seed, ...) planned for `rank` of
        `num_replicas` ranks, at epoch 0: load a state into it to anchor its epochs."""
        return MixtureSampler(self.sizes, None, self.epoch_size, num_replicas, rank,
                              self.shuffle, self.seed, self.drop_last, self.window, self.names,
                              self.groups, self.local_world_size, self.schedule)  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch. A different epoch drops a pending resume position; an epoch
        before the one a state was loaded for cannot be planned (its start is unknown)."""
        epoch = check_flag("epoch", epoch, 0)
        self.epoch_start(epoch)  # refuses an epoch before the loaded one
        if epoch != self.epoch:
            self._resume = self._yielded = 0
        self.epoch = epoch

    def epoch_start(self, epoch: int | None = None) -> tuple[tuple[Cursor, ...], tuple[int, ...]]:
        """(cursors at the epoch's start, the epoch's counts c_k over its phases). After
        new weights at a checkpoint, a cursor is past every record read so far: records an
        epoch resumed so left unread (`sampler.mixture.reweight`) are not in it."""
        cursors, phases, maps = self._epoch(epoch)
        past = tuple(
            advance(c, m[-1][0], n, self.drop_last) if len(m) > 1 else c
            for c, m, n in zip(cursors, maps, self.num_records)
        )
        return past, phases.totals

    def _epoch(
        self, epoch: int | None = None
    ) -> tuple[tuple[Cursor, ...], Phases, tuple[Map, ...]]:
        """(cursors at the epoch's start, its phases, what it reads of each stream), in
        closed form: the anchor epoch's cursors advanced by its counts, then by `counts`
        per epoch (after new weights at a checkpoint, once the holes are read)."""
        e = self.epoch if epoch is None else check_flag("epoch", epoch, 0)
        a = self._anchor
        if e < a.epoch:
            raise ValueError(f"epoch {e} precedes epoch {a.epoch} of the loaded state")
        maps = a.maps or (IDENTITY,) * len(self.names)
        if e == a.epoch:
            return a.cursors, a.phases, maps
        later = [
            after_epochs(m, first, c, e - a.epoch)
            for m, first, c in zip(maps, a.phases.totals, self.counts)
        ]
        cursors = tuple(
            advance(cur, shift, n, self.drop_last)
            for cur, (shift, _), n in zip(a.cursors, later, self.num_records)
        )
        return cursors, self.phases, tuple(m for _, m in later)

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
        """Positions [lo, hi) worker `worker` reads, a range per non-empty part of a phase
        (sampler.resume.phase_parts), so that a DataLoader taking items of `align` records
        from its workers in turn delivers phase 1, then 2, ... (one: ``[worker_range()]``)."""
        self.worker_range(worker, num_workers, align)  # checks the arguments
        segments = phased_streams(self.epoch_phases().bounds, 1, num_workers, align)
        return [(a, b) for _, _, a, b in segments[0][worker]]

    def worker_part(self, worker: int = 0, num_workers: int = 1, align: int = 1) -> MixturePart:
        """`part` of the worker's `worker_range` (with phases, workers read `worker_ranges`)."""
        return self.part(*self.worker_range(worker, num_workers, align))

    def part(self, start: int, stop: int) -> MixturePart:
        """Positions [start, stop) of the epoch: per stream, the pass pieces they read.

        Stream k reads records [n_k(start), n_k(stop)) of its slice of the epoch (n_k the
        schedule's counts), a contiguous range of its sequence from the epoch's cursor.
        """
        cursors, phases, maps = self._epoch()
        if not 0 <= start <= stop <= len(phases):
            raise ValueError(f"need 0 <= start <= stop <= {len(phases)}, got {start}, {stop}")
        a = phases.before(self._ranks, start)
        b = phases.before(self._ranks, stop)
        pieces = tuple(
            tuple(self._pieces(k, cursors[k], maps[k], a[k], b[k])) for k in range(len(a))
        )
        return MixturePart(self.epoch, start, stop, tuple(a), pieces)

    def stream_ids(self, start: int = 0, stop: int | None = None) -> Iterator[I64Array]:
        """Chunks (int64 arrays) of the stream index at each position in [start, stop)."""
        phases = self.epoch_phases()
        return phases.stream_ids(self._ranks, start, len(phases) if stop is None else stop)

    def _pieces(self, k: int, cursor: Cursor, m: Map, x0: int, x1: int) -> Iterator[PassPiece]:
        """Records [x0, x1) stream k reads this epoch by map `m` from `cursor`, as pass
        pieces."""
        for a, b in through(m, x0, x1):
            yield from self._passes.pieces(k, cursor, self.num_replicas, self.rank, a, b)

    # --- records ----------------------------------------------------------------------

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[I64Array, I64Array]]:
        """Chunks of (stream index, record id) arrays for positions [start, stop), merged
        by the schedule from each stream's pass pieces; nothing before `start` is made."""
        stop = len(self) if stop is None else stop
        cursors, phases, maps = self._epoch()
        a = phases.before(self._ranks, start)
        b = phases.before(self._ranks, stop)
        streams = [
            piece_records(self._pieces(k, cursors[k], maps[k], a[k], b[k]), self.offsets[k])
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
        cursors, phases, maps = self._epoch()
        sizes = self.num_records
        streams = {
            n: cursor_state(c, m, [p[k] for p in phases.counts], maps[k], sizes[k])
            for k, (n, c, m) in enumerate(zip(self.names, cursors, phases.totals))
        }
        key = self.schedule_key
        return {"epoch": self.epoch, "position": self._yielded, "streams": streams, "schedule": key}

    def begin_epoch(self, epoch: int, streams: Mapping[str, Any]) -> None:
        """Plan epoch `epoch` as a fresh epoch of this layout, starting where `streams`
        (as ``state_dict()["streams"]``) say each stream stands; cursors of another number
        of ranks are recut for this sampler's (`sampler.mixture.passes.recut`)."""
        epoch = check_flag("epoch", epoch, 0)
        state = {"epoch": epoch, "position": 0, "streams": streams}
        _, _, cursors, *_ = load_cursors(state, self.names, self.num_records, self.drop_last)
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

        Same number of ranks: the epoch goes on as it was planned; a state saved under
        another schedule (its "schedule" key differs) goes on under this one from the next
        record (`reweigh`).

        Another number of ranks (elastic): the epoch's rest is planned anew for the new
        layout, as an epoch of its own. Every old rank had read the same records of each
        stream; each stream's cursor moves past them, and the rest of its current pass is
        cut over the new ranks (`sampler.mixture.passes.recut`; later passes are cut for them
        afresh). The rest of the epoch is ``R_old * (L - position) // R_new`` positions per
        new rank, phase by phase (`Phases.rest`: a phase ends at ``R_old * (B_p - position)
        // R_new``), each apportioned by the counts the old ranks had left of it (largest
        remainder) and stratified on its own. Position then counts from 0, the state's
        counts are the rest's, so a state saved later resumes like any other. Nothing is
        replayed; a pass recut several times keeps each layout in "recut".
        """
        epoch, position, cursors, phases, maps = load_cursors(
            state, self.names, self.num_records, self.drop_last
        )
        old = cursors[0].num_replicas
        if old == self.num_replicas and state.get("schedule") not in (None, self.schedule_key):
            self._anchor = _Anchor(epoch, cursors, phases, maps)
            self.epoch = epoch
            self.reweigh([(0, position)])
            return
        if old != self.num_replicas and any(m != IDENTITY for m in maps):
            raise ValueError(
                "this state's epoch was resumed under new weights; a sampler resumes it in "
                f"its own {old} ranks (a dataset resumes it in any layout)"
            )
        if old != self.num_replicas:
            held = phases.before(self._ranks, position)
            cursors = tuple(
                recut(advance(c, h, n, self.drop_last), self.num_replicas, n, self.drop_last)
                for c, h, n in zip(cursors, held, self.num_records)
            )
            phases = phases.rest(self._ranks, position, old, self.num_replicas)
            position = 0
        self._anchor = _Anchor(epoch, cursors, phases, maps)
        self.epoch, self._resume, self._yielded = epoch, position, position

    def reweigh(self, consumed: Sequence[tuple[int, int]]) -> None:
        """Go on with this epoch under this sampler's schedule after the positions
        `consumed` (ranges; one per DataLoader worker) of the epoch as it was planned were
        read: the rest, from position ``sum(hi - lo)`` to the epoch's end, becomes the epoch
        (position 0), its phases this schedule's over those positions, each stream reading
        the records no consumed position took, then what follows the old plan
        (`sampler.mixture.reweight`)."""
        cursors, phases, maps = self._epoch()
        start = sum(hi - lo for lo, hi in consumed)
        maps = tuple(reweigh(phases, maps, self._ranks, consumed))
        weights = [w for _, w in self.schedule]
        rest = plan_phases(self.phase_items, weights, self.num_replicas, self._ranks, start)
        self._anchor = _Anchor(self.epoch, cursors, rest, maps)
        self._resume = self._yielded = 0
