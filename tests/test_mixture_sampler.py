"""MixtureSampler: DESIGN.md's mixture invariants M1-M6, against brute-force references."""

from __future__ import annotations

import itertools
import json
import math
import tracemalloc
from collections import Counter, defaultdict
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler import MixtureSampler, ShardSampler, stream_seed
from shardstream.sampler.mixture.passes import Cursor, advance, cut_lengths, recut
from shardstream.sampler.mixture.schedule import apportion, counts_before, name_ranks, stream_ids

from .helpers import check_resume

# --- references, the slow obvious way -----------------------------------------------------


def reference_counts(total: int, weights: list[Any], names: list[str]) -> list[int]:
    """Largest remainder: floors, then one seat at a time to the largest remainder left,
    equal remainders to the name first in sorted order."""
    whole = sum(Fraction(w) for w in weights)
    quota = [Fraction(w) * total / whole for w in weights]
    seats = [math.floor(q) for q in quota]
    left = list(range(len(weights)))
    while sum(seats) < total:
        best = max(quota[k] - math.floor(quota[k]) for k in left)
        pick = min((k for k in left if quota[k] - math.floor(quota[k]) == best),
                   key=lambda k: names[k])  # fmt: skip
        seats[pick] += 1
        left.remove(pick)
    return seats


def reference_schedule(counts: list[int], names: list[str]) -> list[int]:
    """Every record of every stream sorted by exact ideal time (2j+1)/(2c_k), then name."""
    items = [
        (Fraction(2 * j + 1, 2 * c), names[k], k) for k, c in enumerate(counts) for j in range(c)
    ]
    return [k for *_, k in sorted(items)]


def pass_records(sizes, world, rank, seed, pass_index, shuffle, drop_last, window) -> list[int]:
    s = ShardSampler(sizes, world, rank, shuffle, seed, drop_last, window)
    s.set_epoch(pass_index)
    return list(s)


def labelled(sampler: MixtureSampler, start: int = 0, stop: int | None = None):
    """Per stream, (pass, record id) of each record positions [start, stop) read, from the
    part's pieces read with plan.chunks, in order."""
    part = sampler.part(start, len(sampler) if stop is None else stop)
    out = []
    for k, pieces in enumerate(part.pieces):
        recs = []
        for p in pieces:
            for chunk in p.plan.chunks(p.start, p.stop):
                ids = sampler.offsets[k][chunk.shards] + chunk.rows
                recs += [(p.pass_index, int(i)) for i in ids]
        out.append(recs)
    return out


def merged(sampler: MixtureSampler, start: int, stop: int) -> list[tuple[int, int]]:
    """Positions [start, stop) rebuilt from the part's pieces and the schedule's ids."""
    per_stream = [iter(recs) for recs in labelled(sampler, start, stop)]
    ids = [int(k) for chunk in sampler.stream_ids(start, stop) for k in chunk]
    return [(k, next(per_stream[k])[1]) for k in ids]


SIZES = [[5, 0, 9, 4], [40, 33, 0, 27], [3]]  # a medium, a large, and a tiny stream
NAMES = ["web", "code", "books"]


def make(rank: int, world: int = 3, **kw: Any) -> MixtureSampler:
    args: dict[str, Any] = dict(weights=[0.5, 0.3, 0.2], epoch_size=60, seed=7, names=NAMES)
    streams = kw.pop("streams", SIZES)
    args.update(kw)
    return MixtureSampler(streams, num_replicas=world, rank=rank, **args)


# --- M1: counts ------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_m1_every_rank_yields_l_and_each_stream_its_count(drop_last: bool) -> None:
    for epoch in range(3):
        for rank in range(3):
            s = make(rank, drop_last=drop_last)
            s.set_epoch(epoch)
            got = list(s)
            assert len(got) == len(s) == 60 // 3
            per = Counter(k for k, _ in got)
            assert [per[k] for k in range(3)] == list(s.counts)
            assert sum(s.counts) == 20
            assert list(s.counts) == reference_counts(20, [0.5, 0.3, 0.2], NAMES)


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(0, 10**13),
    weights=st.lists(
        st.one_of(st.integers(1, 50), st.floats(1e-3, 1e3), st.sampled_from([0.1, 0.2, 0.7])),
        min_size=1,
        max_size=6,
    ),
    data=st.data(),
)
def test_m1_largest_remainder_matches_the_reference(total, weights, data) -> None:
    names = data.draw(st.lists(st.text(min_size=1, max_size=3), min_size=len(weights),
                               max_size=len(weights), unique=True))  # fmt: skip
    got = apportion(total, weights, name_ranks(names))
    assert got == reference_counts(total, weights, names)
    assert sum(got) == total
    # invariant under reordering the streams (ties go by name, not position)
    order = data.draw(st.permutations(range(len(weights))))
    again = apportion(total, [weights[k] for k in order], name_ranks([names[k] for k in order]))
    assert again == [got[k] for k in order]


def test_m1_ties_go_by_name_not_list_position() -> None:
    # three equal weights, one seat left over: the name first in sorted order gets it
    s = MixtureSampler([[10], [10], [10]], epoch_size=4, num_replicas=1, rank=0,
                       names=["b", "a", "c"])  # fmt: skip
    assert s.counts == (1, 2, 1)


# --- M2: pass-wise exactly once -------------------------------------------------------


def passes_read(samplers: list[MixtureSampler], epochs: range) -> dict[tuple[int, int], list]:
    """(stream, pass) -> records all ranks read of it over `epochs`, checking on the way
    that __iter__ yields exactly what the pieces say, and passes come in order per rank."""
    out: dict[tuple[int, int], list] = defaultdict(list)
    for s in samplers:
        last = [-1] * len(s.sizes)
        for e in epochs:
            s.set_epoch(e)
            per_stream = labelled(s)
            got = list(s)
            for k, recs in enumerate(per_stream):
                assert [r for kk, r in got if kk == k] == [r for _, r in recs]
                for p, r in recs:
                    assert p >= last[k]
                    last[k] = p
                    out[k, p].append(r)
    return out


def check_passes(read, sizes, world_lengths, drop_last: bool) -> None:
    """Within each pass: with drop_last no record twice; complete passes miss fewer than
    the records dropped by each cut (< R per layout). Without: only padding repeats."""
    for (k, p), recs in read.items():
        n = sum(sizes[k])
        counts = Counter(recs)
        complete = (k, p + 1) in read
        if drop_last:
            assert max(counts.values()) == 1, f"stream {k} pass {p} repeats a record"
            if complete:
                assert n - len(counts) < sum(world_lengths)
        else:
            if complete:
                assert len(counts) == n, f"stream {k} pass {p} misses records"
                assert len(recs) - n < sum(world_lengths)  # padding only
            assert set(counts) <= set(range(n))


@pytest.mark.parametrize("drop_last", [True, False])
def test_m2_each_pass_once_across_ranks(drop_last: bool) -> None:
    # epoch 60 records over 3 ranks: c = (10, 6, 4) per rank; web (18 records) is read
    # in about 2 passes per epoch, code (100) continues across epochs, books (3) is
    # upsampled by whole passes (1 record per rank per pass)
    samplers = [make(r, drop_last=drop_last) for r in range(3)]
    read = passes_read(samplers, range(12))
    assert max(p for k, p in read if k == 1) >= 2  # code crossed several passes
    assert max(p for k, p in read if k == 2) >= 20  # books: many whole passes
    check_passes(read, SIZES, [3], drop_last)


# --- M3: stratification -------------------------------------------------------------------


def window_deviation(ids: list[int], k: int, c: int, total: int) -> float:
    mine = np.concatenate(([0], np.cumsum(np.asarray(ids) == k)))
    worst = 0.0
    for b in range(1, total + 1):
        held = mine[b:] - mine[:-b]
        worst = max(worst, float(np.abs(held - b * c / total).max()))
    return worst


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=5), data=st.data())
def test_m3_schedule_is_the_exact_merge_and_windows_hold_the_mix(counts, data) -> None:
    if sum(counts) == 0:
        return
    names = [f"s{k}" for k in data.draw(st.permutations(range(len(counts))))]
    ranks = name_ranks(names)
    want = reference_schedule(counts, names)
    total = sum(counts)
    # the seekable counts agree with the merge at every position
    for i in range(total + 1):
        assert counts_before(counts, ranks, i) == [want[:i].count(k) for k in range(len(counts))]
    # any slice, in any chunking, is the same order
    lo = data.draw(st.integers(0, total))
    hi = data.draw(st.integers(lo, total))
    chunk = data.draw(st.integers(1, 7))
    got = [int(k) for c in stream_ids(counts, ranks, lo, hi, chunk) for k in c]
    assert got == want[lo:hi]
    # after i positions: within (1 + (K - 2) c_k / L) / 2 of i c_k / L (K streams with
    # records); windows: within 1 + (K - 2) c_k / L of B c_k / L, so within 2 for K <= 3
    live = sum(1 for c in counts if c)
    held = np.cumsum(np.eye(len(counts), dtype=np.int64)[want], axis=0)
    for k, c in enumerate(counts):
        after = np.abs(held[:, k] - np.arange(1, total + 1) * c / total)
        assert after.max() <= (1 + max(0, live - 2) * c / total) / 2 + 1e-9
        if live <= 5:
            assert after.max() < 2
        dev = window_deviation(want, k, c, total)
        assert dev <= 1 + max(0, live - 2) * c / total + 1e-9
        if live <= 3:
            assert dev < 2


def test_m3_many_single_record_streams_are_the_merge_limit() -> None:
    # four streams: three of one record each meet at t = 1/2; no merge of fixed times keeps
    # this window within 2, the general bound 1 + (K - 2) c_k / L still holds
    ids = reference_schedule([97, 1, 1, 1], ["a", "b", "c", "d"])
    assert [int(k) for c in stream_ids([97, 1, 1, 1], [0, 1, 2, 3], 0, 100) for k in c] == ids
    assert ids[49:52] == [1, 2, 3]
    assert 2 < window_deviation(ids, 0, 97, 100) <= 1 + 2 * 97 / 100


def test_m3_float_ties_of_distinct_times_are_ordered_exactly() -> None:
    # times (2j+1)/(2c) of these two records differ, but round to the same float64, and
    # the one of the stream named later comes first
    c0, c1, j0, j1 = 1042729293387485, 632974309568067, 881709973334541, 535229771667416
    t0, t1 = Fraction(2 * j0 + 1, 2 * c0), Fraction(2 * j1 + 1, 2 * c1)
    assert (2 * j0 + 1) / (2 * c0) == (2 * j1 + 1) / (2 * c1) and t1 < t0
    counts, ranks = [c0, c1], [0, 1]
    # stream 0's records before t1: odd o with o / (2 c0) < t1; the next one is j0
    below = (((2 * j1 + 1) * c0 - 1) // c1 + 1) // 2
    assert below == j0
    i = j1 + below  # the position of record j1 of stream 1
    assert counts_before(counts, ranks, i) == [j0, j1]
    assert counts_before(counts, ranks, i + 1) == [j0, j1 + 1]
    got = [int(k) for c in stream_ids(counts, ranks, i - 1, i + 3, chunk=2) for k in c]
    assert got[1:3] == [1, 0]  # the name order alone would have put stream 0 first


# --- M4: determinism, epochs, names ---------------------------------------------------------


def test_m4_deterministic_reshuffled_per_epoch_and_keyed_by_name() -> None:
    a, b = make(1), make(1)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    # reordering the list of streams (with their names and weights) changes no stream's
    # records: seeds and counts are keyed by name
    order = [2, 0, 1]
    c = MixtureSampler([SIZES[k] for k in order], [[0.5, 0.3, 0.2][k] for k in order], 60,
                       3, 1, seed=7, names=[NAMES[k] for k in order])  # fmt: skip
    for e in range(4):
        a.set_epoch(e)
        c.set_epoch(e)
        mine = list(a)
        theirs = list(c)
        for k in range(3):
            assert [r for kk, r in mine if kk == k] == [
                r for kk, r in theirs if kk == order.index(k)
            ]
    assert stream_seed(7, "web") != stream_seed(7, "code") != stream_seed(8, "code")


# --- M5: resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_m5_resume_anywhere_in_the_same_layout(drop_last: bool) -> None:
    check_resume(lambda: make(2, drop_last=drop_last), [1, 7, 10, 19], epoch=3, key=tuple)


def test_m5_state_is_json_and_the_same_on_every_rank() -> None:
    states = []
    for rank in range(3):
        s = make(rank)
        s.set_epoch(5)
        it = iter(s)
        for _ in range(7):
            next(it)
        states.append(json.loads(json.dumps(s.state_dict())))
    assert states[0] == states[1] == states[2]
    assert states[0]["position"] == 7 and states[0]["epoch"] == 5
    assert set(states[0]["streams"]) == set(NAMES)
    assert states[0]["streams"]["web"]["count"] == 10


def test_m5_cursor_of_any_epoch_in_closed_form() -> None:
    s = make(0)
    s.set_epoch(1000)
    state = s.state_dict()["streams"]
    # code: 100 records, 3 ranks, no drop_last: 34 per pass; 6 per epoch
    assert state["code"] == {"pass": 6000 // 34, "consumed": 6000 % 34,
                             "num_replicas": 3, "count": 6, "records": 100}  # fmt: skip


def elastic_run(build, worlds: list[int], at: list[int], epochs: int):
    """worlds[0] ranks read epoch 0 and `at[0]` records of epoch 1, are resized to
    worlds[1] ranks, which read at[1] records of the rest (at most all of it), ...; the last
    layout reads on to the end of epoch `epochs - 1`. `build(rank, world)` makes a sampler.
    Returns (stream, pass) -> records of all ranks, and each new layout's first state."""
    read: dict[tuple[int, int], list] = defaultdict(list)
    states = []
    layout = [build(r, worlds[0]) for r in range(worlds[0])]
    read_all(layout, read, range(0, 1))
    for new_world, count in zip(worlds[1:], at):
        state = None
        for s in layout:
            s.set_epoch(1)
            start = s.state_dict()["position"]
            stop = min(len(s), start + count)
            per_stream = labelled(s, start, stop)
            it = iter(s)
            add(read, per_stream, [next(it) for _ in range(stop - start)])
            state = json.loads(json.dumps(s.state_dict()))
        layout = [build(r, new_world) for r in range(new_world)]
        for s in layout:
            s.load_state_dict(state)
        states.append(layout[0].state_dict())
    for s in layout:  # the rest of epoch 1 in the last layout
        s.set_epoch(1)
        add(read, labelled(s, s.state_dict()["position"]), list(s))
    read_all(layout, read, range(2, epochs))
    return read, states


def add(read, per_stream, got) -> None:
    for k, recs in enumerate(per_stream):
        assert [r for kk, r in got if kk == k] == [r for _, r in recs]
        for p, r in recs:
            read[k, p].append(r)


def read_all(samplers, read, epochs) -> None:
    for s in samplers:
        for e in epochs:
            s.set_epoch(e)
            add(read, labelled(s), list(s))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize(("before", "after", "at"), [(3, [2], [7]), (2, [3], [13]),
                                                     (3, [2, 3], [5, 6])])  # fmt: skip
def test_m5_elastic_resume_keeps_each_pass_once(before, after, at, drop_last) -> None:
    build = lambda rank, world: make(rank, world, drop_last=drop_last)  # noqa: E731
    read, states = elastic_run(build, [before, *after], at, epochs=6)
    check_passes(read, SIZES, [before, *after], drop_last)
    # "code" (100 records, spans of 33 or 34) is mid-pass at every resize: each one cut
    # the rest of its pass anew, and the state names every earlier layout
    layouts = [[r["num_replicas"] for r in st["streams"]["code"]["recut"]] for st in states]
    assert layouts == [[before, *after][:i] for i in range(1, len(after) + 1)]


def test_m5_elastic_rest_of_epoch_is_the_old_ranks_rest() -> None:
    old = make(0, 3)
    it = iter(old)
    for _ in range(7):
        next(it)
    state = old.state_dict()
    new = make(1, 2)
    new.load_state_dict(state)
    assert len(new) == 3 * (20 - 7) // 2
    rest = [c - h for c, h in zip(old.counts, counts_before(old.counts, old._ranks, 7))]
    assert list(new.epoch_counts()) == reference_counts(len(new), rest, NAMES)
    after = new.state_dict()
    assert after["position"] == 0 and after["streams"]["code"]["num_replicas"] == 2
    # a pass recut while in progress records its earlier layout
    assert any("recut" in v for v in after["streams"].values())
    new.set_epoch(2)
    assert len(new) == 60 // 2


@pytest.mark.parametrize("drop_last", [True, False])
def test_m5_new_weights_apply_from_the_resumed_record(drop_last: bool) -> None:
    read: dict[tuple[int, int], list] = defaultdict(list)
    for rank in range(3):
        old = make(rank, drop_last=drop_last)
        old.set_epoch(2)
        whole = labelled(old)  # what the old weights would have read this epoch
        add(read, labelled(old, 0, 5), list(itertools.islice(iter(old), 5)))
        state = json.loads(json.dumps(old.state_dict()))
        new = make(rank, weights=[1, 1, 2], drop_last=drop_last)
        assert new.counts == (5, 5, 10)
        new.load_state_dict(state)
        # the rest of the epoch (15 positions) by the new weights, from the next record
        assert len(new) == 15 and new.state_dict()["position"] == 0
        assert list(new.epoch_counts()) == reference_counts(15, [1, 1, 2], NAMES)
        rest = labelled(new)
        add(read, rest, list(new))
        for k, recs in enumerate(rest):
            held_k = sum(1 for _ in labelled(old, 0, 5)[k])
            left = whole[k][held_k:]  # the records the old plan had left for stream k
            n = min(len(left), len(recs))
            assert recs[:n] == left[:n]  # read first, in order
        # later epochs: the new weights, passes going on
        read_all([new], read, range(3, 6))
        new.set_epoch(3)
        assert Counter(k for k, _ in new) == Counter({0: 5, 1: 5, 2: 10})
    # epochs 0-1 under the old weights, for complete passes
    read_all([make(r, drop_last=drop_last) for r in range(3)], read, range(2))
    check_passes(read, SIZES, [3], drop_last)


def test_m5_a_state_of_another_source_is_refused() -> None:
    state = make(0).state_dict()
    other = make(0, streams=[[5, 0, 9], SIZES[1], SIZES[2]])  # web lost a shard
    with pytest.raises(ValueError, match="saved for a stream of 18 records; this stream 'web'"):
        other.load_state_dict(state)


# --- M6: one stream is the single-source sampler ------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_m6_one_stream_reads_what_shard_sampler_reads(shuffle: bool) -> None:
    sizes = [4, 0, 9, 6, 2]
    for world in (1, 3, 4):
        for rank in range(world):
            m = MixtureSampler([sizes], [1], 21, world, rank, shuffle, seed=3, drop_last=True)
            # the stream's own seed: derived from the seed and its name
            ref = ShardSampler(sizes, world, rank, shuffle, stream_seed(3, "stream0"), True)
            for e in range(3):
                m.set_epoch(e)
                ref.set_epoch(e)
                assert [r for _, r in m] == list(ref)


# --- workers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_worker_parts_partition_the_epoch_and_read_what_iter_yields(drop_last: bool) -> None:
    for rank in range(3):
        s = make(rank, drop_last=drop_last)
        for epoch in (0, 3):
            s.set_epoch(epoch)
            full = list(s)
            for workers in range(1, 5):
                for align in (1, 3, 4, 8):
                    ranges = [s.worker_range(w, workers, align) for w in range(workers)]
                    assert ranges[0][0] == 0 and ranges[-1][1] == len(s)
                    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
                    assert all(lo % align == 0 for lo, _ in ranges)
                    for w, (lo, hi) in enumerate(ranges):
                        part = s.worker_part(w, workers, align)
                        assert (part.start, part.stop) == (lo, hi)
                        assert merged(s, lo, hi) == full[lo:hi]


# --- properties -----------------------------------------------------------------------------------

mixtures = st.fixed_dictionaries(
    {
        "streams": st.lists(
            st.lists(st.integers(0, 12), min_size=1, max_size=5).filter(lambda s: sum(s) >= 4),
            min_size=1,
            max_size=3,
        ),
        "world": st.integers(1, 4),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32),
        "window": st.integers(1, 3),
    }
)


@settings(max_examples=40, deadline=None)
@given(case=mixtures, data=st.data())
def test_properties_over_random_mixtures(case: dict, data: st.DataObject) -> None:
    k = len(case["streams"])
    weights = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    epoch_size = data.draw(st.integers(case["world"], 40))
    epoch = data.draw(st.integers(0, 4))
    workers = data.draw(st.integers(1, 4))
    align = data.draw(st.integers(1, 5))

    def build(rank: int) -> MixtureSampler:
        return MixtureSampler(case["streams"], weights, epoch_size, case["world"], rank,
                              case["shuffle"], case["seed"], case["drop_last"],
                              case["window"])  # fmt: skip

    length = epoch_size // case["world"]
    samplers = [build(r) for r in range(case["world"])]
    for s in samplers:
        s.set_epoch(epoch)
        got = list(s)
        assert len(got) == len(s) == length
        assert list(s.counts) == reference_counts(length, weights, s.names)
        per = Counter(kk for kk, _ in got)
        assert [per[kk] for kk in range(k)] == list(s.counts)
        assert [kk for kk, _ in got] == reference_schedule(list(s.counts), s.names)
        for w in range(workers):
            lo, hi = s.worker_range(w, workers, align)
            assert merged(s, lo, hi) == got[lo:hi]
    # M2 over the epochs so far, every rank
    read = passes_read([build(r) for r in range(case["world"])], range(epoch + 1))
    check_passes(read, case["streams"], [case["world"]], case["drop_last"])
    # M5: resume at a drawn point
    rank = data.draw(st.integers(0, case["world"] - 1))
    point = data.draw(st.integers(0, length))
    check_resume(lambda: build(rank), [point], epoch=epoch, key=tuple)


@settings(max_examples=40, deadline=None)
@given(case=mixtures, data=st.data())
def test_properties_of_elastic_resumes(case: dict, data: st.DataObject) -> None:
    k = len(case["streams"])
    weights = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    fewest = min(sum(s) for s in case["streams"]) if case["drop_last"] else 4
    worlds = data.draw(st.lists(st.integers(1, min(4, fewest)), min_size=2, max_size=3))
    epoch_size = data.draw(st.integers(max(worlds), 40))
    at = data.draw(st.lists(st.integers(0, 40), min_size=len(worlds) - 1,
                            max_size=len(worlds) - 1))  # fmt: skip

    def build(rank: int, world: int) -> MixtureSampler:
        return MixtureSampler(case["streams"], weights, epoch_size, world, rank,
                              case["shuffle"], case["seed"], case["drop_last"],
                              case["window"])  # fmt: skip

    read, _ = elastic_run(build, worlds, at, epochs=3)
    check_passes(read, case["streams"], worlds, case["drop_last"])


# --- cursors --------------------------------------------------------------------------------------


def test_recut_chains_lay_the_rest_end_to_end() -> None:
    # 10 records, 3 ranks, drop_last: spans of 3; each rank read 1; the rest (6) over 4
    # ranks: 1 each (2 dropped); over 2 ranks: 3 each
    cur = Cursor(4, 1, 3)
    four = recut(cur, 4, 10, True)
    assert four == Cursor(4, 0, 4, ((3, 1),))
    assert cut_lengths(10, True, four) == [3, 1]
    assert recut(cur, 2, 10, True) == Cursor(4, 0, 2, ((3, 1),))
    assert cut_lengths(10, True, recut(cur, 2, 10, True)) == [3, 3]
    # a rest shorter than the new ranks with drop_last: the next pass starts
    assert recut(Cursor(4, 2, 3), 4, 10, True) == Cursor(5, 0, 4)
    # an untouched pass is cut afresh
    assert recut(Cursor(4, 0, 3), 2, 10, True) == Cursor(4, 0, 2)
    # advancing skips whole passes in closed form
    assert advance(Cursor(0, 2, 3), 10**12, 10, True) == Cursor(
        (10**12 + 2) // 3, (10**12 + 2) % 3, 3
    )


# --- cost -----------------------------------------------------------------------------------------


def test_planning_cost_grows_with_shards_not_records() -> None:
    rng = np.random.default_rng(0)
    streams = [rng.integers(1000, 20_000, size=2000) for _ in range(3)]
    tracemalloc.start()
    try:
        s = MixtureSampler(streams, [0.6, 0.3, 0.1], 10**12, 8, 7, seed=1)
        s.set_epoch(10**6)
        mid = len(s) // 2
        part = s.part(mid, mid + 1000)
        ids = next(s.stream_ids(mid, mid + 1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(s) == 10**12 // 8
    assert sum(len(p) for p in part.pieces) <= 6 and ids.size == 1000
    assert peak < 20 * 2**20  # the epoch alone has 1.25e11 positions


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1, 0, 1]}, "'code' must be finite and > 0, got 0"),
        ({"weights": [1, -2.5, 1]}, "got -2.5"),
        ({"weights": [1, 1, float("nan")]}, "got nan"),
        ({"weights": [float("inf"), 1, 1]}, "got inf"),
        ({"weights": [1, 1]}, "need 3 weights"),
        ({"names": ["a", "b", "a"]}, "repeated: ['a']"),
        ({"epoch_size": 2}, "epoch_size // num_replicas = 2 // 3 = 0"),
        ({"streams": [], "names": None}, "at least one stream"),
        (
            {"streams": [[1, 1], [50], [9]], "drop_last": True},
            "'web' has 2 records, fewer than num_replicas=3",
        ),
        ({"streams": [[0, 0], [50], [9]]}, "'web' has 0 records"),
        ({"streams": [[1, -1], [50], [9]]}, "stream 'web': shard 1 has -1 records"),
    ],
)  # fmt: skip
def test_bad_mixtures_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        make(0, **kwargs)
    assert message in str(err.value)


def test_numpy_integers_are_ints() -> None:
    s = MixtureSampler([np.array([3, 4]), [5]], [np.int64(2), np.float32(1.5)], np.int64(12),
                       np.int64(2), np.int64(1), seed=np.int64(3))  # fmt: skip
    assert len(s) == 6 and s.rank == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda st: st.pop("streams"), "state['streams'] must be a dict"),
        (lambda st: st["streams"].pop("web"), "missing ['web']"),
        (lambda st: st["streams"]["web"].update(consumed=99), "99 consumed is past its end"),
        (lambda st: st["streams"]["web"].update(num_replicas=5), "different num_replicas: [3, 5]"),
        (lambda st: st.update(position=21), "exceeds the epoch's 20 records"),
        (lambda st: st["streams"]["code"].update(count=-1), "['count'] must be an int >= 0"),
    ],
)
def test_bad_states_are_named(edit, message: str) -> None:
    state = make(0).state_dict()
    edit(state)
    with pytest.raises(ValueError) as err:
        make(0).load_state_dict(state)
    assert message in str(err.value)


def test_an_epoch_before_the_loaded_one_is_refused() -> None:
    s = make(0)
    s.set_epoch(4)
    t = make(0)
    t.load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="epoch 2 precedes epoch 4"):
        t.set_epoch(2)
