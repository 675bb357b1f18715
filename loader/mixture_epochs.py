"""A mixture's epochs and resume states: the sampler's epoch, the job layout, and states
that add each stream's cursor at the epoch's start (see loader.mixture)."""

from __future__ import annotations

import logging
from typing import Any

from shardstream.sampler import MixtureSampler, Topology
from shardstream.sampler.mixture.state import cursor_state
from shardstream.sampler.resume import cut_segments, resume_point

from .base import DatasetBase
from .cache.locality import NodeOptions
from .state import Layout, MixLayout, is_worker_state, rank_state
from .streams import Stream
from .tokens.packing import Packing

__all__ = ["MixtureEpochs"]

logger = logging.getLogger(__name__)


class MixtureEpochs(DatasetBase):
    """The epochs and states of a MixtureDataset (which sets the attributes below)."""

    sampler: MixtureSampler
    streams: list[Stream]
    names: list[str]
    packings: list[Packing]
    node: NodeOptions
    nodes: list[NodeOptions]
    _node_args: tuple[Any, Any, Any, Any]

    def _check_nodes(self, world_size: int) -> None:
        """The node options, and each stream's, for a job of `world_size` ranks."""
        self.node = NodeOptions.check(*self._node_args, world_size)
        self.nodes = [self.node.for_stream(s.cache_dir, s.cache_limit) for s in self.streams]

    def _adopt(self, topo: Topology) -> None:
        self._check_nodes(topo.world_size)
        for packing in self.packings:
            packing.check_ranks(topo.world_size)
        self.sampler = self.sampler.for_rank(topo.world_size, topo.rank)

    def _cache_nodes(self) -> list[NodeOptions]:
        """Each stream's node options (its own cache folder and limit)."""
        return self.nodes

    def _layout(self, num_workers: int) -> Layout:
        s = self.sampler
        ends = self._root_sampler().epoch_phases().bounds  # in the epoch's plans' positions
        return MixLayout(
            s.num_replicas, num_workers, self.batch_size or 0, s.epoch_size, s.drop_last, ends=ends
        )

    def _root_sampler(self) -> MixtureSampler:
        """A planner of the current epoch in the layout it started in (its phases)."""
        s, resized = self.sampler, self._resized(self.epoch)
        if resized:
            return self._sampler_for(self._root_replicas(), 0, self.epoch)
        return self._sampler_for(s.num_replicas, s.rank, self.epoch)

    def _resized(self, epoch: int) -> bool:
        """Whether `epoch` is one resumed from a state cut for another number of ranks."""
        root = self._root_state()
        at_root = root is not None and root["epoch"] == epoch
        return at_root and self._root_replicas() != self.sampler.num_replicas

    def _root_state(self) -> dict[str, Any] | None:
        state = self._resume
        while state is not None and "elastic" in state:
            state = state["elastic"]
        return state

    def _root_replicas(self) -> int:
        root = self._root_state()
        return int(root.get("num_replicas", self.sampler.num_replicas)) if root else 0

    def _sampler_epoch(self, epoch: int) -> None:
        """Set the sampler's epoch, unless it is one resumed from a state cut for another
        number of ranks (load_state_dict anchored the sampler there)."""
        if not self._resized(epoch):
            self.sampler.set_epoch(epoch)

    def _streams_state(self) -> dict[str, Any]:
        """Per stream, the cursor at the current epoch's start in the layout it started in."""
        if self._resume is not None and self._resume["epoch"] == self.epoch:
            return dict(self._resume["streams"])
        self.sampler.set_epoch(self.epoch)
        return dict(self.sampler.state_dict()["streams"])

    def stats(self) -> dict[str, Any]:
        """As StreamingDataset.stats; with a `schedule`, also "phases": a rank's plan of the
        current epoch (in the layout it started in), phase by phase: its positions (records,
        or blocks with `pack`, then also "tokens": blocks x the pack length) and each
        stream's share of them, by name."""
        totals = super().stats()
        if len(self.sampler.schedule) > 1:
            phases = self._root_sampler().epoch_phases()
            length = self.packings[0].pack.length if self.packings else None
            totals["phases"] = [
                {
                    "positions": sum(counts),
                    "per_stream": dict(zip(self.names, counts)),
                    **({"tokens": sum(counts) * length} if length else {}),
                }
                for counts in phases.counts
            ]
        return totals

    def _mixture_state(self) -> dict[str, Any]:
        """What a mixture's state adds: each stream's cursor at the epoch's start, the key
        of the schedule the epoch is read under (an elastic rest: the saved one's), and how
        its phases are cut among workers."""
        # "phase_cut" 2: workers' parts of phases as a deal of the items gives them
        # (sampler.resume.phase_parts; state.MixLayout reads it)
        out: dict[str, Any] = {"streams": self._streams_state(), "phase_cut": 2}
        resume = self._resume
        key: int | None = self.sampler.schedule_key
        if resume is not None and resume["epoch"] == self.epoch:
            key = resume.get("schedule")
        if key is not None:
            out["schedule"] = key
        return out

    def state_dict(self) -> dict[str, Any]:
        """As StreamingDataset.state_dict, plus each stream's cursor ("streams") and the
        schedule's key ("schedule")."""
        return {**super().state_dict(), **self._mixture_state()}

    def consumed_state(self, consumed: int, num_workers: int) -> dict[str, Any]:
        """As StreamingDataset.consumed_state, plus each stream's cursor at the epoch's
        start ("streams": pass, records consumed in it, ranks it was cut for, c_k) and
        the schedule's key ("schedule")."""
        return {**super().consumed_state(consumed, num_workers), **self._mixture_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue an epoch, also in another layout (see StreamingDataset.load_state_dict).

        A rank's state of this job's number of ranks, saved under another schedule (or
        other weights), goes on from the rank's next item under this dataset's: the rest
        of the epoch is planned anew (sampler.mixture.reweight), each stream reading first
        the records of its plan no rank had read. Otherwise the epoch finishes with the
        saved per-stream counts, and the next one starts where the saved layout left each
        stream (recut for this job's ranks) with this dataset's weights."""
        gathered = rank_state(state)
        state = gathered if gathered is not None else state
        if not isinstance(state, dict) or not isinstance(state.get("streams"), dict):
            raise ValueError(f"a mixture state needs 'streams' (per-stream cursors), got {state!r}")
        checked = self._accept(state)
        self._resume = checked
        self._cursor.reset(checked["position"])
        self._role = None
        self._state.select(checked["epoch"])
        epoch, replicas = checked["epoch"], self._root_replicas()
        same = replicas == self.sampler.num_replicas
        if same:
            self.sampler.load_state_dict(
                {"epoch": epoch, "position": 0, "streams": state["streams"]}
            )
        if self._new_schedule(checked):
            if same and not is_worker_state(checked) and "elastic" not in checked:
                self._reweigh(checked)  # a rank's own state: the new weights from here
                return
            logger.warning(
                "the state's epoch %d was saved under another schedule (or weights) by a "
                "job of another layout (or one worker's state): the epoch ends under the "
                "saved one, and this dataset's applies from epoch %d",
                epoch,
                epoch + 1,
            )
        if same:
            return
        old = self._sampler_for(replicas, 0, epoch)
        cursors, counts = old.epoch_start(epoch + 1)
        after = {n: cursor_state(c, m) for n, c, m in zip(self.names, cursors, counts)}
        self.sampler.begin_epoch(epoch + 1, after)

    def _new_schedule(self, state: dict[str, Any]) -> bool:
        """Whether `state` was saved under another schedule (or weights) than this one."""
        return bool(state.get("schedule", self.sampler.schedule_key) != self.sampler.schedule_key)

    def _reweigh(self, state: dict[str, Any]) -> None:
        """Go on with `state`'s epoch (loaded into the sampler) under this schedule: the
        positions each of the state's workers had delivered are read; the rest is planned
        anew from the rank's next item, as a fresh epoch (position 0)."""
        self._resume = None
        old = self._layout(0).of(state)
        mine = old.streams(None)[self.sampler.rank]
        records = [sum(b - a for *_, a, b in segs) for segs in mine]
        skips, _ = resume_point([-(-n // old.item) for n in records], state["position"])
        consumed = [
            (a, b)
            for segs, n, k in zip(mine, records, skips)
            for *_, a, b in cut_segments(segs, 0, min(n, k * old.item))
        ]
        self.sampler.reweigh(consumed)
        self._cursor.reset(0)

    def _sampler_for(self, num_replicas: int, rank: int, epoch: int) -> MixtureSampler:
        """Rank `rank`'s planner of `epoch` in a layout of `num_replicas` ranks, anchored
        where the epoch started (the loaded state's cursors, or this sampler's)."""
        mine = self.sampler
        if num_replicas == mine.num_replicas and rank == mine.rank and not self._resized(epoch):
            mine.set_epoch(epoch)
            return mine
        other = mine.for_rank(num_replicas, rank)
        other.load_state_dict({"epoch": epoch, "position": 0, "streams": self._streams_state()})
        return other
