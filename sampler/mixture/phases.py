"""A mixture epoch in phases: each phase its own counts and stratified schedule.

A schedule ``[(E_1, w_1), (E_2, w_2), ...]`` splits an epoch of E = sum E_p items (across
ranks) into phases with weights of their own. With R ranks, a rank's first
``B_1 // R`` positions are phase 1, its first ``B_2 // R`` phases 1 and 2, ... (B_p the
cumulative E's), so the phases of a rank add up to ``E // R`` positions. Inside phase p,
stream k holds the largest remainder share of the phase's positions by w_p, spread by the
stratified schedule of `sampler.mixture.schedule` on its own. Fixed weights are the
one-phase schedule ``[(E, w)]``.

The streams' passes run on across phases: phases only say how many records of each stream
each stretch of the epoch takes, in order, from the stream's sequence (its cursor).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate

import numpy as np
import numpy.typing as npt

from .schedule import apportion, counts_before, stream_ids

__all__ = ["Phases", "phase_bounds", "plan_phases"]

I64Array = npt.NDArray[np.int64]
Weights = Sequence[int | float | Fraction]


def phase_bounds(items: Sequence[int], num_replicas: int) -> tuple[int, ...]:
    """Each phase's end in a rank's positions: the cumulative items // num_replicas."""
    return tuple(b // num_replicas for b in accumulate(items))


@dataclass(frozen=True)
class Phases:
    """The counts of an epoch's phases: ``counts[p][k]`` positions of stream k in phase p."""

    counts: tuple[tuple[int, ...], ...]

    @property
    def lengths(self) -> tuple[int, ...]:
        """Positions of each phase."""
        return tuple(sum(c) for c in self.counts)

    @property
    def bounds(self) -> tuple[int, ...]:
        """Each phase's end position."""
        return tuple(accumulate(self.lengths))

    @property
    def totals(self) -> tuple[int, ...]:
        """Per stream, its positions over the whole epoch."""
        return tuple(int(sum(col)) for col in zip(*self.counts))

    def __len__(self) -> int:
        return sum(self.lengths)

    def before(self, ranks: Sequence[int], position: int) -> list[int]:
        """Per stream, how many of the epoch's first `position` positions it holds."""
        if not 0 <= position <= len(self):
            raise ValueError(f"position must lie in [0, {len(self)}], got {position}")
        held = [0] * len(ranks)
        start = 0
        for counts, length in zip(self.counts, self.lengths):
            inside = counts_before(counts, ranks, min(length, position - start))
            held = [h + c for h, c in zip(held, inside)]
            start += length
            if position <= start:
                break
        return held

    def stream_ids(self, ranks: Sequence[int], start: int, stop: int) -> Iterator[I64Array]:
        """Chunks of the stream index of each position in [start, stop)."""
        if not 0 <= start <= stop <= len(self):
            raise ValueError(f"need 0 <= start <= stop <= {len(self)}, got {start}, {stop}")
        lo = 0
        for counts, length in zip(self.counts, self.lengths):
            a, b = max(start, lo), min(stop, lo + length)
            if a < b:
                yield from stream_ids(counts, ranks, a - lo, b - lo)
            lo += length

    def rest(self, ranks: Sequence[int], position: int, old: int, new: int) -> Phases:
        """The epoch's rest after `position`, for `new` ranks after `old` ranks had each
        read `position` positions: phase p's end moves to ``old * (B_p - position) // new``
        (the rest laid over the new ranks, phase by phase), and each phase's positions are
        apportioned by the counts it had left."""
        held = self.before(ranks, position)
        out, left, end = [], list(held), 0
        for counts, bound in zip(self.counts, self.bounds):
            inside = [min(c, h) for c, h in zip(counts, left)]
            left = [h - i for h, i in zip(left, inside)]
            rest = [c - i for c, i in zip(counts, inside)]
            stop = old * max(0, bound - position) // new
            out.append(tuple(apportion(stop - end, rest, ranks)))
            end = stop
        return Phases(tuple(out))


def plan_phases(
    items: Sequence[int],
    weights: Sequence[Weights],
    num_replicas: int,
    ranks: Sequence[int],
    start: int = 0,
) -> Phases:
    """A fresh epoch's phases for `num_replicas` ranks: phase p's positions
    (`phase_bounds`) apportioned by `weights[p]`; with `start`, only the positions from
    there on (the rest of an epoch, sampler.mixture.reweight)."""
    bounds = phase_bounds(items, num_replicas)
    lengths = [max(0, b - max(a, start)) for a, b in zip((0, *bounds), bounds)]
    return Phases(tuple(tuple(apportion(n, w, ranks)) for n, w in zip(lengths, weights)))
