"""Resume states of a StreamingDataset, and which records each worker reads after one.

A state is a few integers, JSON-serializable:

    {"epoch": e, "position": k, "num_workers": W, "num_replicas": R, "batch_size": B,
     "local_world_size": N (with locality="node"),
     "elastic": <the state this epoch was resumed from, when that was a different layout>}

`position` counts items (records, or batches of B) one rank consumed from a DataLoader with
W workers (0: iterated directly) in a job of R ranks. Loaded into the same layout, each
worker skips its share (sampler.resume.resume_point) and the DataLoader's round-robin goes
on where it stopped. Loaded into another layout (other R, W or B: an elastic resume), what
no rank consumed is cut anew over the new ranks and workers (sampler.resume.continue_streams);
that epoch's states then carry the old one under "elastic".

A state without "num_workers" is one worker's own count, as torchdata's StatefulDataLoader
saves per worker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sampler.epoch import rank_length
from sampler.resume import Segment, Streams, base_streams, continue_streams, resume_point

__all__ = ["Layout", "check_state"]

_INTS = ("epoch", "position", "num_workers", "num_replicas", "batch_size", "local_world_size")


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
            return base_streams(self.length, self.num_replicas, self.num_workers, self.item)
        old = self.of(base)
        return continue_streams(
            old.streams(base.get("elastic")),
            old.item,
            base["position"],
            self.num_replicas,
            self.num_workers,
            self.item,
            self.drop_last,
        )

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
        if "num_workers" in state and self.of(state) != self:
            return state  # elastic: the rest of that state's epoch, cut anew
        base: dict[str, Any] | None = state.get("elastic")
        return base

    def worker_part(
        self, state: dict[str, Any] | None, epoch: int, rank: int, worker: int
    ) -> tuple[list[Segment], int]:
        """(segments, items to skip) for one worker of this job after loading `state`."""
        base = self.base_of(state, epoch)
        mine = self.streams(base)[rank]
        if state is None or state["epoch"] != epoch or base is state:
            return mine[worker], 0
        if "num_workers" not in state:  # one worker's own count
            return mine[worker], state["position"]
        counts = [-(-sum(b - a for *_, a, b in s) // self.item) for s in mine]
        skips, due = resume_point(counts, state["position"])
        role = (due + worker) % len(mine)
        return mine[role], skips[role]
