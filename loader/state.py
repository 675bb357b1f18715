"""Resume states of a StreamingDataset, and which records each worker reads after one.

A state is a few integers, JSON-serializable, and says the layout it was counted in:

    {"epoch": e, "position": k, "num_workers": W, "num_replicas": R, "batch_size": B,
     "num_records": N, "local_world_size": L (with locality="node"),
     "elastic": <the state this epoch was resumed from, when that was a different layout>}

A *rank state* (`consumed_state`, or `state_dict()` iterated without workers): `position`
counts items (records, or batches of B) one rank consumed from a DataLoader with W workers
(0: iterated directly) in a job of R ranks; in a DDP loop every rank consumed as many, so
it is the same on every rank. Loaded into the same layout, each worker skips its share
(sampler.resume.resume_point) and the DataLoader's round-robin goes on where it stopped.
Loaded into another layout (other R, W or B: an elastic resume), what no rank consumed is
cut anew over the new ranks and workers (sampler.resume.continue_streams); that epoch's
states then carry the old one under "elastic".

A *worker state* adds "rank" and "worker": one DataLoader worker's own count, as torchdata's
StatefulDataLoader saves per worker. It resumes only that worker, in the layout it was
saved in (anything else is a ValueError naming both layouts). A StatefulDataLoader's whole
state gathers its workers' states: `rank_state` turns it into the rank state, which loads
into any layout. (States of earlier versions, {"epoch", "position"}, are worker states
without their layout: taken to be this layout's.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from shardstream.sampler.epoch import rank_length
from shardstream.sampler.resume import (
    Segment,
    Streams,
    base_streams,
    continue_streams,
    phased_streams,
    resume_point,
)

__all__ = ["Layout", "MixLayout", "check_state", "is_worker_state", "rank_state"]

_INTS = (
    "epoch",
    "position",
    "num_workers",
    "num_replicas",
    "batch_size",
    "local_world_size",
    "num_records",
    "rank",
    "worker",
    "phase_cut",
)
# torchdata's StatefulDataLoader state: its keys this module reads
_SNAPSHOT, _WORKERS, _STEPS = "_snapshot", "_worker_snapshots", "_steps_since_snapshot"
_DATASET_STATE = "dataset_state"


def check_state(state: Any, where: str = "state") -> dict[str, Any]:
    """The state, validated: ValueError naming the bad key and value."""
    if not isinstance(state, dict):
        raise ValueError(f"{where} must be a dict, got {type(state).__name__}")
    for key in _INTS:
        value = state.get(key, 0 if key not in ("epoch", "position") else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}[{key!r}] must be an int >= 0, got {value!r}")
    if "elastic" in state:
        check_state(state["elastic"], f"{where}['elastic']")
    return dict(state)


def is_worker_state(state: dict[str, Any]) -> bool:
    """Whether a state is one DataLoader worker's own count (not a rank's)."""
    return "worker" in state or "num_workers" not in state


def rank_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """The rank state of a torchdata StatefulDataLoader's whole state (None if `state` is
    not one): its dataset state without workers, or, with workers, their counts gathered.
    The loader takes items from its workers in turn, so the rank consumed the sum of its
    workers' counts (plus the steps taken since the loader's last snapshot)."""
    if not isinstance(state, dict):
        return None
    if _SNAPSHOT not in state:
        inner = state.get(_DATASET_STATE)
        return dict(inner) if "_num_yielded" in state and isinstance(inner, dict) else None
    snapshots = state[_SNAPSHOT].get(_WORKERS) or {}
    workers = [
        check_state((snapshots[k] or {}).get(_DATASET_STATE), f"the loader state's {k}")
        for k in sorted(snapshots, key=lambda k: int(k.rsplit("_", 1)[-1]))
    ]
    if not workers:
        raise ValueError("the StatefulDataLoader state holds no worker states")
    first = workers[0]
    if not all(is_worker_state(w) and "worker" in w for w in workers):
        raise ValueError(
            "the StatefulDataLoader state's workers hold states without their layout (saved "
            "by an earlier version): load it with loader.load_state_dict in the layout it "
            "was saved in"
        )
    shared = {k: v for k, v in first.items() if k not in ("position", "worker")}
    for w in workers:
        if {k: v for k, v in w.items() if k not in ("position", "worker")} != shared:
            raise ValueError(
                "the StatefulDataLoader state's workers disagree on the epoch or layout "
                f"({first} and {w}): is it one loader's state?"
            )
    if sorted(w["worker"] for w in workers) != list(range(first["num_workers"])):
        raise ValueError(
            f"the StatefulDataLoader state holds {len(workers)} worker states for a loader of "
            f"{first['num_workers']} workers: is it one loader's whole state?"
        )
    out = {k: v for k, v in shared.items() if k != "rank"}
    out["position"] = sum(w["position"] for w in workers) + int(state.get(_STEPS, 0))
    return out


@dataclass(frozen=True)
class Layout:
    """How a job reads the current epoch: its ranks, workers and item size (the layout
    positions are counted in), over a dataset of `num_records`."""

    num_replicas: int
    num_workers: int  # 0: no DataLoader workers
    batch_size: int  # 0: items are records
    num_records: int
    drop_last: bool
    local_world_size: int = 0  # ranks per node with locality="node"; 0: global reshuffle

    @property
    def length(self) -> int:
        """Records per rank in a whole epoch of this layout."""
        return rank_length(self.num_records, self.num_replicas, self.drop_last)

    @property
    def item(self) -> int:
        return self.batch_size or 1

    def describe(self, rank: int | None = None, worker: int | None = None) -> str:
        """The layout in words, for errors: ranks, workers, item size, records."""
        ranks = (
            f"{self.num_replicas} ranks"
            if rank is None
            else (f"rank {rank} of {self.num_replicas} ranks")
        )
        workers = f"{self.num_workers} DataLoader workers" if self.num_workers else "no workers"
        if worker is not None and self.num_workers:
            workers = f"worker {worker} of {workers}"
        items = f"batches of {self.batch_size}" if self.batch_size else "records"
        nodes = f", {self.local_world_size} ranks a node" if self.local_world_size else ""
        return f"{ranks}, {workers}, {items}{nodes}, {self.num_records} records an epoch"

    def check(self, state: dict[str, Any], rank: int, worker: int | None) -> None:
        """ValueError unless `state` can resume here: a state of another dataset size
        never can; a worker state only in its own layout, on its own rank (`worker`: the
        DataLoader worker reading, 0 without workers; None while not known, before
        iterating, when only the dataset size is checked)."""
        saved = state.get("num_records", self.num_records)
        if saved != self.num_records:
            raise ValueError(
                f"the state was saved for an epoch of {saved} records, and this dataset's "
                f"epoch has {self.num_records}: a state resumes the dataset (and epoch_size) "
                "it was saved for"
            )
        if worker is None or not is_worker_state(state) or "worker" not in state:
            return
        old = self.of(state)
        if old != self or state["rank"] != rank:
            raise ValueError(
                f"this state is one DataLoader worker's, saved by "
                f"{old.describe(state['rank'], state['worker'])}; it is loaded into "
                f"{self.describe(rank)}. A StatefulDataLoader's load_state_dict resumes its "
                "workers only in the layout and on the rank they were saved in. To resume in "
                "another layout, give the loader's whole state to the dataset before making "
                "the loader: ds.load_state_dict(loader_state); loader = "
                "StatefulDataLoader(ds, batch_size=None, num_workers=W) (README: 'Stopping "
                "and resuming'); each rank loads a state saved by a rank of the old job"
            )

    def of(self, state: dict[str, Any]) -> Layout:
        """The layout the state counted its position in."""
        return replace(
            self,
            num_replicas=state.get("num_replicas", self.num_replicas),
            num_workers=state.get("num_workers", self.num_workers),
            batch_size=state.get("batch_size", self.batch_size),
            # a full state without it was saved by a job without locality
            local_world_size=state.get("local_world_size", 0)
            if "num_workers" in state
            else self.local_world_size,
        )

    def streams(self, base: dict[str, Any] | None) -> Streams:
        """[rank][worker] -> segments of this layout in an epoch resumed from `base`."""
        if base is None:
            return self.fresh_streams()
        old = self.of(base)
        return continue_streams(
            old.streams(base.get("elastic")),
            old.item,
            base["position"],
            self.num_replicas,
            self.num_workers,
            self.item,
            self.drop_last,
            self.phase_ends(),
            self.cumulative,
        )

    def fresh_streams(self) -> Streams:
        """[rank][worker] -> segments of an epoch not resumed: each worker its own plan."""
        return base_streams(self.length, self.num_replicas, self.num_workers, self.item)

    def phase_ends(self) -> tuple[int, ...]:
        """The epoch's phases' ends (a mixture's schedule); () for one phase."""
        return ()

    @property
    def cumulative(self) -> bool:
        """Whether phases are cut among workers as a deal of the epoch's items gives them
        (sampler.resume.phase_parts), not each phase on its own."""
        return True

    def root(self, base: dict[str, Any] | None) -> Layout:
        """The layout the epoch started in: segments index its plans."""
        layout = self
        while base is not None:
            layout, base = layout.of(base), base.get("elastic")
        return layout

    def base_of(self, state: dict[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        """The state this layout's epoch derives from, after loading `state` (None: the
        epoch's own plans)."""
        if state is None or state["epoch"] != epoch:
            return None
        if not is_worker_state(state) and self.of(state) != self:
            return state  # elastic: the rest of that state's epoch, cut anew
        base: dict[str, Any] | None = state.get("elastic")
        return base

    def worker_part(
        self, state: dict[str, Any] | None, epoch: int, rank: int, worker: int
    ) -> tuple[list[Segment], int, int]:
        """(segments, items to skip, role) for one worker of this job after loading
        `state`: the worker reads the segments of worker `role` of its rank (on a resume
        the DataLoader's round-robin starts at worker 0, so worker w goes on as the worker
        due w-th; a worker state names its role)."""
        base = self.base_of(state, epoch)
        mine = self.streams(base)[rank]
        if state is None or state["epoch"] != epoch or base is state:
            return mine[worker], 0, worker
        if is_worker_state(state):  # one worker's own count
            role = state.get("worker", worker)
            return mine[role], state["position"], role
        counts = [-(-sum(b - a for *_, a, b in s) // self.item) for s in mine]
        skips, due = resume_point(counts, state["position"])
        role = (due + worker) % len(mine)
        return mine[role], skips[role], role


@dataclass(frozen=True)
class MixLayout(Layout):
    """A job layout over a mixture's epoch: `num_records` is the epoch size E, and every
    rank reads exactly E // R positions (the rest of a resized epoch is cut as the
    dataset's drop_last says). Segments hold positions of their rank's epoch, and each
    worker reads its part of each phase in turn (sampler.resume.phased_streams)."""

    ends: tuple[int, ...] = ()  # the phases' ends in the epoch's plan (in the root layout)
    # how phases are cut among workers: 2 as the epoch's items dealt in turn give them
    # (sampler.resume.phase_parts); 1 each phase on its own (states saved before
    # "phase_cut": a layout of its own where it differs, so such a state resumes as an
    # elastic one, exactly)
    phase_cut: int = 2

    @property
    def length(self) -> int:
        return self.ends[-1] if self.ends else self.num_records // self.num_replicas

    def fresh_streams(self) -> Streams:
        ends = self.ends or (self.length,)
        return phased_streams(ends, self.num_replicas, self.num_workers, self.item, self.cumulative)

    def phase_ends(self) -> tuple[int, ...]:
        return self.ends

    @property
    def cumulative(self) -> bool:
        return self.phase_cut >= 2

    def of(self, state: dict[str, Any]) -> Layout:
        workers = state.get("num_workers", self.num_workers)
        old = state.get("phase_cut", 1) < 2 and workers > 1 and len(self.ends) > 1
        return Layout.of(replace(self, phase_cut=1 if old else 2), state)

    def describe(self, rank: int | None = None, worker: int | None = None) -> str:
        old = "" if self.cumulative else ", phases cut among workers one by one (saved so)"
        return super().describe(rank, worker) + old
