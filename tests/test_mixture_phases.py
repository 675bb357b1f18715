"""Mixture phases (a schedule of weights along the epoch), on the sampler: per-phase
counts, phase order, passes running on across phases, resume and elastic resume."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler import MixtureSampler
from shardstream.sampler.epoch import worker_span
from shardstream.sampler.mixture.phases import Phases, phase_bounds
from shardstream.sampler.resume import Segment, continue_streams, phase_parts, phased_streams

from .helpers import check_resume
from .test_mixture_sampler import (
    add,
    check_passes,
    elastic_run,
    labelled,
    merged,
    passes_read,
    read_all,
    reference_counts,
    reference_schedule,
)

SIZES = [[5, 0, 9, 4], [40, 33, 0, 27], [3]]
NAMES = ["web", "code", "books"]
SCHEDULE = [(36, {"web": 3, "code": 1}), (24, {"web": 1, "code": 1, "books": 2})]


def make(rank: int, world: int = 3, **kw: Any) -> MixtureSampler:
    args: dict[str, Any] = dict(schedule=SCHEDULE, seed=7, names=NAMES)
    args.update(kw)
    return MixtureSampler(kw.pop("streams", SIZES), num_replicas=world, rank=rank, **args)


def phase_weights(schedule: list, names: list[str]) -> list[list[Any]]:
    return [[w.get(n, 0) if isinstance(w, dict) else w[k] for k, n in enumerate(names)]
            for _, w in schedule]  # fmt: skip


def check_phases(s: MixtureSampler, schedule: list, got: list[tuple[int, int]]) -> None:
    """A rank's epoch: phase p's positions are the cumulative items // R, its counts the
    largest remainder by the phase's weights (each within one of its exact share), and
    its positions the phase's own stratified schedule."""
    ends = phase_bounds([e for e, _ in schedule], s.num_replicas)
    assert len(got) == len(s) == ends[-1] == sum(e for e, _ in schedule) // s.num_replicas
    ids = [k for k, _ in got]
    for (lo, hi), weights in zip(zip((0, *ends), ends), phase_weights(schedule, s.names)):
        want = reference_counts(hi - lo, weights, s.names) if hi > lo else [0] * len(weights)
        held = Counter(ids[lo:hi])
        assert [held[k] for k in range(len(weights))] == want
        for c, w in zip(want, weights):
            assert abs(c - Fraction(w) * (hi - lo) / sum(Fraction(x) for x in weights)) < 1
        assert ids[lo:hi] == reference_schedule(want, s.names)


def test_each_phase_holds_its_items_and_weights() -> None:
    for world in (1, 2, 3, 4):
        for rank in range(world):
            s = make(rank, world)
            for epoch in range(3):
                s.set_epoch(epoch)
                check_phases(s, SCHEDULE, list(s))
    s = make(0)
    assert s.epoch_size == 60 and s.phases.counts == ((9, 3, 0), (2, 2, 4))
    # books weighs nothing in phase 1: none of its records comes before position 12
    assert {k for k, _ in list(s)[:12]} == {0, 1}


def test_one_phase_is_the_fixed_weights_mixture() -> None:
    fixed = MixtureSampler(SIZES, [0.5, 0.3, 0.2], 60, 3, 1, seed=7, names=NAMES)
    phased = MixtureSampler(SIZES, None, None, 3, 1, seed=7, names=NAMES,
                            schedule=[(60, [0.5, 0.3, 0.2])])  # fmt: skip
    for epoch in range(3):
        fixed.set_epoch(epoch)
        phased.set_epoch(epoch)
        assert list(fixed) == list(phased)
        assert fixed.state_dict() == phased.state_dict()  # no "phases" key for one phase


@pytest.mark.parametrize("drop_last", [True, False])
def test_passes_run_on_across_phases(drop_last: bool) -> None:
    # phase 2 starts in the middle of web's and code's passes: they go on, no record twice
    read = passes_read([make(r, drop_last=drop_last) for r in range(3)], range(8))
    check_passes(read, SIZES, [3], drop_last)
    assert max(p for k, p in read if k == 1) >= 1  # code crossed passes


def test_worker_ranges_take_their_part_of_each_phase() -> None:
    s = make(0, 1, schedule=[(10, {"web": 1}), (7, {"books": 1})])
    assert s.worker_ranges(0, 2, 1) == [(0, 5), (10, 13)]
    assert s.worker_ranges(1, 2, 1) == [(5, 10), (13, 17)]
    # units of 4 dealt in turn (0, 1, 0, 1, 1): through phase 1 (10 positions) worker 0
    # holds units 0 and 2 (its 2nd in part), so the loader's items come phase by phase;
    # cut phase by phase (4, 6 then 4, 3) worker 1's 2nd item held 8, 9 after 10-13
    assert s.worker_ranges(0, 2, 4) == [(0, 6), (10, 12)]
    assert s.worker_ranges(1, 2, 4) == [(6, 10), (12, 17)]


def test_the_state_keeps_the_phases_and_resumes_exactly() -> None:
    s = make(1)
    s.set_epoch(2)
    it = iter(s)
    for _ in range(15):
        next(it)
    state = json.loads(json.dumps(s.state_dict()))
    assert state["streams"]["books"]["phases"] == [0, 4]
    check_resume(lambda: make(1), [1, 11, 12, 13, 19], epoch=2, key=tuple)


def test_bad_schedules_are_named() -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        (dict(schedule=[(10, {"web": 1, "news": 1})]), r"streams \['news'\]"),
        (dict(schedule=[(10, {"web": 0})]), "every stream weighs 0"),
        (dict(schedule=[(0, {"web": 1})]), "items must be an int >= 1"),
        (dict(schedule=[(10, {"web": -1})]), "weight of 'web' must be a finite number >= 0"),
        (dict(schedule=[(10, [1, 1])]), "needs 3 weights"),
        (dict(schedule=[(10, {"web": 1})], epoch_size=12), "hold 10 items, and epoch_size=12"),
        (dict(schedule=[(10, {"web": 1})], weights=[1, 1, 1]), "weights or a schedule"),
        (dict(schedule=[]), "at least one phase"),
        (dict(schedule={"web": 1}), "a list of"),
    ]
    for kw, message in bad:
        with pytest.raises(ValueError, match=message):
            make(0, **kw)


def test_elastic_rest_is_cut_phase_by_phase() -> None:
    old = make(0, 3)
    it = iter(old)
    for _ in range(10):  # 10 of phase 1's 12 positions
        next(it)
    new = make(1, 2)
    new.load_state_dict(old.state_dict())
    # phase 1's rest: 3 ranks x 2 positions over 2 ranks = 3; phase 2: 3 x 8 / 2 = 12
    assert new.epoch_phases().lengths == (3, 12)
    held = old.phases.before(old._ranks, 10)
    rest1 = [c - h for c, h in zip(old.phases.counts[0], held)]
    assert list(new.epoch_phases().counts[0]) == reference_counts(3, rest1, NAMES)
    assert list(new.epoch_phases().counts[1]) == reference_counts(12, [2, 2, 4], NAMES)


schedules = st.lists(
    st.tuples(st.integers(1, 30), st.lists(st.integers(0, 5), min_size=3, max_size=3)).filter(
        lambda p: sum(p[1]) > 0
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None)
@given(
    schedule=schedules,
    world=st.integers(1, 3),  # books has 3 records: with drop_last, at most 3 ranks
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_properties_over_random_schedules(schedule, world, drop_last, seed, data) -> None:
    if sum(e for e, _ in schedule) < 3:  # every rank of up to 3 reads a record
        schedule = [(3, schedule[0][1]), *schedule[1:]]

    def build(rank: int, num_replicas: int = world) -> MixtureSampler:
        return MixtureSampler(SIZES, None, None, num_replicas, rank, True, seed, drop_last,
                              names=NAMES, schedule=schedule)  # fmt: skip

    epoch = data.draw(st.integers(0, 3))
    samplers = [build(r) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
        got = list(s)
        check_phases(s, schedule, got)
        workers, align = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
        covered = sorted(r for w in range(workers) for r in s.worker_ranges(w, workers, align))
        assert [x for a, b in covered for x in range(a, b)] == list(range(len(s)))
        for a, b in covered:
            assert merged(s, a, b) == got[a:b]
    read = passes_read([build(r) for r in range(world)], range(epoch + 1))
    check_passes(read, SIZES, [world], drop_last)
    rank = data.draw(st.integers(0, world - 1))
    check_resume(lambda: build(rank), [data.draw(st.integers(0, len(samplers[0])))],
                 epoch=epoch, key=tuple)  # fmt: skip
    # elastic: each pass once across every layout, the rest in phase order
    worlds = [world, data.draw(st.integers(1, 3))]
    at = [data.draw(st.integers(0, len(samplers[0])))]
    read, _ = elastic_run(lambda r, w: build(r, w), worlds, at, epochs=3)
    check_passes(read, SIZES, worlds, drop_last)


def test_phases_arithmetic_by_brute_force() -> None:
    phases = Phases(((3, 1, 0), (0, 2, 2)))
    ids = [int(k) for c in phases.stream_ids([2, 1, 0], 0, 8) for k in c]
    for position in range(9):
        held = Counter(ids[:position])
        assert phases.before([2, 1, 0], position) == [held[k] for k in range(3)]
    assert phases.totals == (3, 3, 2) and phases.bounds == (4, 8) and len(phases) == 8


@settings(max_examples=40, deadline=None)
@given(
    before=schedules,
    after=schedules,
    world=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_properties_of_new_weights_at_a_checkpoint(before, after, world, seed, data) -> None:
    """A state saved under one schedule, loaded under another of the same epoch size: the
    rest of the epoch follows the new phases from the next record, no record of a pass is
    read twice or left out, and a state saved after resumes exactly."""
    total = max(3, sum(e for e, _ in before))
    before = [(total - sum(e for e, _ in before[1:]), before[0][1]), *before[1:]]
    scale = [max(1, e * total // sum(e for e, _ in after)) for e, _ in after]
    after = [(e, w) for e, (_, w) in zip(scale, after)]
    after[-1] = (after[-1][0] + total - sum(e for e, _ in after), after[-1][1])
    if after[-1][0] < 1:
        return

    def build(rank: int, schedule: list) -> MixtureSampler:
        return MixtureSampler(SIZES, None, None, world, rank, True, seed, True,
                              names=NAMES, schedule=schedule)  # fmt: skip

    read: dict[tuple[int, int], list] = defaultdict(list)
    length = total // world
    at = data.draw(st.integers(0, length))
    for rank in range(world):
        old = build(rank, before)
        old.set_epoch(1)
        add(read, labelled(old, 0, at), list(itertools.islice(iter(old), at)))
        state = json.loads(json.dumps(old.state_dict()))
        new = build(rank, after)
        new.load_state_dict(state)
        ends = phase_bounds([e for e, _ in after], world)
        want = [max(0, b - max(a, at)) for a, b in zip((0, *ends), ends)]
        if new.schedule_key != old.schedule_key:  # the same schedule: the epoch goes on
            assert new.epoch_phases().lengths == tuple(want)
            for n, counts, (_, w) in zip(want, new.epoch_phases().counts, after):
                assert list(counts) == (reference_counts(n, w, NAMES) if n else [0, 0, 0])
        start = new.state_dict()["position"]  # 0 after new weights, else `at`
        rest = list(new)
        assert len(rest) == length - at
        add(read, labelled(new, start), rest)
        # a state saved inside the resumed epoch resumes it exactly
        point = data.draw(st.integers(0, len(rest)))
        again = build(rank, after)
        again.load_state_dict(state)
        taken = list(itertools.islice(iter(again), point))
        later = build(rank, after)
        later.load_state_dict(json.loads(json.dumps(again.state_dict())))
        assert taken + list(later) == rest
        read_all([new], read, range(2, 5))
    read_all([build(r, before) for r in range(world)], read, range(1))
    check_passes(read, SIZES, [world], True)


@settings(max_examples=100, deadline=None)
def _delivered_phases(mine: list[list[Segment]], item: int, ends: tuple[int, ...]) -> list[int]:
    """The phase of each record a DataLoader delivers, taking items (`item` positions) from
    the workers (their segments, `mine`) in turn."""
    queues = [[x for _, _, a, b in segs for x in range(a, b)] for segs in mine]
    items = [[q[i : i + item] for i in range(0, len(q), item)] for q in queues]
    turns = itertools.zip_longest(*items, fillvalue=[])
    return [
        int(np.searchsorted(ends, x, side="right")) for turn in turns for it in turn for x in it
    ]


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4).filter(lambda x: sum(x) > 0),
    world=st.integers(1, 4),
    workers=st.integers(0, 4),
    item=st.integers(1, 4),
    data=st.data(),
)
def test_worker_layout_delivers_phases_in_order_and_cuts_the_rest_by_phase(
    lengths, world, workers, item, data
) -> None:
    """The layout a mixture's DataLoader workers read (sampler.resume): each worker its part
    of each phase (their counts dealt in turn), so the loader's turns deliver the phases in
    order, record by record; an elastic rest cut phase by phase reads what no rank read, once."""
    ends = tuple(itertools.accumulate(lengths))
    streams = phased_streams(ends, world, workers, item)
    for mine in streams:
        positions = sorted(x for segs in mine for _, _, a, b in segs for x in range(a, b))
        assert positions == list(range(ends[-1]))
        # the DataLoader's turns: one item (item positions) from each worker in turn
        assert _delivered_phases(mine, item, ends) == sorted(_delivered_phases(mine, item, ends))
    consumed = data.draw(st.integers(0, -(-ends[-1] // item)))
    new_world, new_workers = data.draw(st.integers(1, 4)), data.draw(st.integers(0, 3))
    rest = continue_streams(streams, item, consumed, new_world, new_workers, item, True, ends)
    read = Counter(
        (r, x) for mine in rest for segs in mine for r, _, a, b in segs for x in range(a, b)
    )
    assert max(read.values(), default=1) == 1  # drop_last: nothing twice
    for mine in rest:  # each new rank: the same count, phase by phase in each worker
        assert sum(b - a for segs in mine for *_, a, b in segs) == sum(
            b - a for segs in rest[0] for *_, a, b in segs
        )
        phases = _delivered_phases(mine, item, ends)  # the new loader's turns: in order too
        assert phases == sorted(phases)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    workers=st.integers(1, 6),
    align=st.integers(1, 5),
)
def test_phase_parts_end_with_each_workers_span_share(
    lengths: list[int], workers: int, align: int
) -> None:
    """Each phase cut in contiguous parts in worker order; over the epoch each worker reads
    exactly its worker_span share (so a one-phase epoch is cut as before phases existed)."""
    parts = phase_parts(lengths, workers, align)
    for n, cut in zip(lengths, parts):
        assert cut[0][0] == 0 and cut[-1][1] == n
        assert all(lo <= hi for lo, hi in cut)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    total = sum(lengths)
    for w in range(workers):
        lo, hi = worker_span(0, total, w, workers, align)
        assert sum(cut[w][1] - cut[w][0] for cut in parts) == hi - lo
    assert phase_parts([total], workers, align) == phase_parts([total], workers, align, False)
