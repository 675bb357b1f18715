"""ShardSampler: DESIGN.md's invariants 1-7, checked against a brute-force reference."""

from __future__ import annotations

import json
import math
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler import ShardSampler, distinct_per_batch
from shardstream.sampler.epoch import shard_order

from .conftest import REPO, torchrun
from .helpers import check_resume


def reference(sizes, world, rank, worker, workers, seed, epoch, shuffle, drop_last):
    """(shard, row) pairs a worker reads, in line order, built the slow obvious way."""
    order = shard_order(len(sizes), seed, epoch, shuffle).tolist()
    line = [(s, row) for s in order for row in range(sizes[s])]
    n = len(line)
    length = n // world if drop_last else math.ceil(n / world)
    total = length * world
    line = line[:total] if drop_last else (line * (total // n + 1))[:total] if n else line
    lo = rank * length + length * worker // workers
    hi = rank * length + length * (worker + 1) // workers
    return line[lo:hi]


def records(sampler: ShardSampler, worker: int = 0, workers: int = 1) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for chunk in sampler.plan(worker, workers).chunks():
        out += zip(chunk.shards.tolist(), chunk.rows.tolist())
    return out


cases = st.fixed_dictionaries(
    {
        "sizes": st.lists(st.integers(0, 40), min_size=0, max_size=12),
        "world": st.integers(1, 6),
        "workers": st.integers(1, 4),
        "seed": st.integers(0, 2**32),
        "epoch": st.integers(0, 5),
        "shuffle": st.booleans(),
        "drop_last": st.booleans(),
        "window": st.integers(1, 4),
    }
)


@settings(max_examples=250, deadline=None)
@given(case=cases)
def test_plans_match_the_reference_and_invariants(case: dict) -> None:
    sizes, world, workers = case["sizes"], case["world"], case["workers"]
    n = sum(sizes)
    length = n // world if case["drop_last"] else math.ceil(n / world)
    offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    everything: Counter[tuple[int, int]] = Counter()
    pairs = 0
    for rank in range(world):
        sampler = ShardSampler(
            sizes, world, rank, case["shuffle"], case["seed"], case["drop_last"], case["window"]
        )
        sampler.set_epoch(case["epoch"])
        ids = list(sampler)
        # invariant 1: every rank yields exactly len() records, the same on every rank
        assert len(sampler) == len(ids) == length
        rank_records: Counter[tuple[int, int]] = Counter()
        for w in range(workers):
            got = records(sampler, w, workers)
            want = reference(
                sizes,
                world,
                rank,
                w,
                workers,
                case["seed"],
                case["epoch"],
                case["shuffle"],
                case["drop_last"],
            )
            # the worker reads exactly its contiguous part of the line ...
            assert Counter(got) == Counter(want)
            if not case["shuffle"]:
                assert got == want  # ... and without shuffling, in storage order
            rank_records += Counter(got)
            pairs += len({s for s, _ in got})
        # the workers together read exactly the rank's records; ids are shard offset + row
        assert Counter(int(offsets[s]) + r for s, r in rank_records.elements()) == Counter(ids)
        everything += rank_records
    # invariant 2: exactly once with drop_last; else all at least once, only padding repeats
    assert sum(everything.values()) == world * length
    if case["drop_last"]:
        assert max(everything.values(), default=1) == 1
    else:
        assert len(everything) == n
        assert sum(c - 1 for c in everything.values()) == world * length - n
    # invariant 5: contiguous spans touch at most S + R*W - 1 (rank-worker, shard) pairs,
    # plus the padding runs (fewer than R records)
    nonempty = sum(1 for s in sizes if s)
    assert pairs <= nonempty + world * workers - 1 + max(0, world * length - n)


@settings(max_examples=60, deadline=None)
@given(case=cases, data=st.data())
def test_resume_anywhere(case: dict, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, case["world"] - 1))

    def make() -> ShardSampler:
        return ShardSampler(
            case["sizes"],
            case["world"],
            rank,
            case["shuffle"],
            case["seed"],
            case["drop_last"],
            case["window"],
        )

    length = len(make())
    positions = data.draw(st.lists(st.integers(0, length), max_size=3))
    check_resume(make, positions, epoch=case["epoch"])


def test_resume_in_big_mixed_blocks() -> None:
    # blocks of several CHUNKs: the seek must land inside a later slice of a block
    sizes = [70_000, 50_000, 90_000, 3, 65_536]
    make = lambda: ShardSampler(sizes, 2, 1, seed=9)  # noqa: E731
    full = list(make())
    for k in (1, 65_535, 65_536, 100_001, len(full) - 1):
        s = make()
        s.load_state_dict({"epoch": 0, "position": k})
        assert list(s) == full[k:]


def test_epochs_reshuffle_shard_order_and_in_shard_order() -> None:
    sizes = [100] * 20
    s = ShardSampler(sizes, 1, 0, seed=3)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert sorted(first) == sorted(second) == list(range(2000))
    assert first != second
    shards_first = list(dict.fromkeys(r // 100 for r in first))
    shards_second = list(dict.fromkeys(r // 100 for r in second))
    assert shards_first != shards_second  # the order shards are opened in changed
    rows = lambda ids, shard: [r for r in ids if r // 100 == shard]  # noqa: E731
    assert rows(first, 0) != rows(second, 0)  # so did the order inside a shard
    assert rows(first, 0) != sorted(rows(first, 0))


def test_seed_and_epoch_do_not_collide_like_a_sum() -> None:
    sizes = [50] * 10
    a = ShardSampler(sizes, 1, 0, seed=1)  # seed 1, epoch 0
    b = ShardSampler(sizes, 1, 0, seed=0)
    b.set_epoch(1)  # seed 0, epoch 1: seed + epoch would make these equal
    assert list(a) != list(b)


def test_mixing_spreads_shards_over_batches() -> None:
    sizes = [1000] * 64
    s = ShardSampler(sizes, 2, 0, seed=0, window=8)
    shards = np.array(list(s)) // 1000
    assert distinct_per_batch(shards, 64) > 6.5  # ~8 open shards, all seen in each batch
    plain = ShardSampler(sizes, 2, 0, seed=0, window=1)
    assert distinct_per_batch(np.array(list(plain)) // 1000, 64) < 1.1


def test_unshuffled_is_storage_order_cut_in_spans() -> None:
    s = [list(ShardSampler([3, 0, 4, 2], 3, r, shuffle=False)) for r in range(3)]
    assert s == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    padded = [list(ShardSampler([2, 3], 4, r, shuffle=False)) for r in range(4)]
    assert padded == [[0, 1], [2, 3], [4, 0], [1, 2]]


def test_shard_cut_between_ranks_is_a_contiguous_row_range() -> None:
    s0, s1 = (ShardSampler([10], 2, r, seed=4) for r in range(2))
    p0, p1 = s0.plan(), s1.plan()
    assert (p0.starts.tolist(), p0.stops.tolist()) == ([0], [5])
    assert (p1.starts.tolist(), p1.stops.tolist()) == ([5], [10])
    assert sorted(s1) == [5, 6, 7, 8, 9] and list(s1) != [5, 6, 7, 8, 9]


def test_accepts_an_object_with_shard_sizes() -> None:
    class Index:
        shard_sizes = (4, 4)

    assert len(ShardSampler(Index(), 2, 1)) == 4


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([3, -1],), {}, "shard 1 has -1 records"),
        (([[1, 2]],), {}, "1-D sequence of record counts"),
        (([1.5],), {}, "1-D sequence of record counts"),
        (([1], 2, 2), {}, r"Invalid rank 2"),
        (([1], 0, 0), {}, "num_replicas must be >= 1"),
        (([1], 1, 0), {"window": 0}, "window must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardSampler(*args, **kwargs)


def test_numpy_integers_are_taken_as_torch_takes_them() -> None:
    sizes = [7, 0, 12, 5]
    plain = ShardSampler(sizes, 3, 1, seed=5, window=2)
    numpy = ShardSampler(sizes, np.int64(3), np.int32(1), seed=np.int64(5), window=np.int32(2))
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        numpy.set_epoch(np.int64(epoch))
        assert list(numpy) == list(plain) and len(numpy) == len(plain)
    assert [type(v) for v in (numpy.num_replicas, numpy.rank, numpy.seed, numpy.window)] == [
        int
    ] * 4
    json.dumps(numpy.state_dict())  # still plain ints
    with pytest.raises(ValueError, match=r"seed must be an int >= .*, got 5\.0 \(float\)"):
        ShardSampler(sizes, 1, 0, seed=5.0)
    with pytest.raises(ValueError, match=r"window must be an int >= 1, got True \(bool\)"):
        ShardSampler(sizes, 1, 0, window=True)


def test_bad_plan_and_state_arguments_are_named() -> None:
    s = ShardSampler([5, 5], 1, 0)
    with pytest.raises(ValueError, match=r"worker must lie in \[0, 1\], got 2"):
        s.plan(worker=2, num_workers=2)
    with pytest.raises(ValueError, match="num_workers must be an int >= 1, got 0"):
        s.plan(num_workers=0)
    with pytest.raises(ValueError, match="exceeds the epoch's 10 records"):
        s.load_state_dict({"epoch": 0, "position": 11})
    with pytest.raises(ValueError, match=r"lacks \['position'\]"):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        s.set_epoch(-1)


def test_state_is_a_few_json_integers() -> None:
    s = ShardSampler([5, 5], 1, 0)
    it = iter(s)
    next(it), next(it)
    assert s.state_dict() == {"epoch": 0, "position": 2}


def test_planning_cost_grows_with_shards_not_records() -> None:
    # invariant 6: one rank of 4096 over 1,000,000 shards and 10**10 records
    sizes = np.full(1_000_000, 10_000, dtype=np.int64)
    tracemalloc.start()
    try:
        sampler = ShardSampler(sizes, 4096, 4095, seed=1)
        plan = sampler.plan()
        first = next(plan.chunks(len(plan) - 10))  # seek to the end of the span
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sampler) == len(plan) == 10**10 // 4096 + 1
    assert len(first) == 10
    assert plan.shards.size <= 10**6 // 4096 + 2
    # a permutation of all records would need 80 GB; of the rank's records, 20 MB
    assert peak < 150 * 2**20


def test_under_torchrun_ranks_come_from_the_process_group() -> None:
    sizes = [7, 0, 13, 5, 9, 1, 30]
    for mode in ("drop_last", "pad"):
        out = torchrun(REPO / "tests" / "dist" / "shard_sampler_allgather.py", mode, nproc=3)
        line = next(x for x in out[0].splitlines() if x.startswith("IDS "))
        per_rank = json.loads(line[4:])
        assert [len(ids) for ids in per_rank] == [65 // 3 if mode == "drop_last" else 22] * 3
        flat = [i for ids in per_rank for i in ids]
        if mode == "drop_last":
            assert len(set(flat)) == len(flat)
        else:
            assert set(flat) == set(range(sum(sizes)))
        for rank, ids in enumerate(per_rank):
            expect = list(ShardSampler(sizes, 3, rank, seed=5, drop_last=mode == "drop_last"))
            assert ids == expect


@settings(max_examples=40, deadline=None)
@given(case=cases)
def test_all_plans_equal_each_ranks_own_plan(case: dict) -> None:
    args = (case["sizes"], case["world"])
    kw = dict(shuffle=case["shuffle"], seed=case["seed"], drop_last=case["drop_last"])
    first = ShardSampler(*args, 0, window=case["window"], **kw)
    first.set_epoch(case["epoch"])
    for rank, worker, plan in first.all_plans(case["workers"]):
        own = ShardSampler(*args, rank, window=case["window"], **kw)
        own.set_epoch(case["epoch"])
        mine = own.plan(worker, case["workers"])
        assert plan.shards.tolist() == mine.shards.tolist()
        assert (plan.starts.tolist(), plan.stops.tolist()) == (
            mine.starts.tolist(),
            mine.stops.tolist(),
        )
        assert [c.rows.tolist() for c in plan.chunks()] == [c.rows.tolist() for c in mine.chunks()]


@settings(max_examples=60, deadline=None)
@given(case=cases, align=st.integers(1, 6))
def test_aligned_worker_cuts_fall_on_batch_boundaries(case: dict, align: int) -> None:
    s = ShardSampler(
        case["sizes"],
        case["world"],
        case["world"] - 1,
        case["shuffle"],
        case["seed"],
        case["drop_last"],
        case["window"],
    )
    lengths = s.worker_lengths(case["workers"], align)
    assert sum(lengths) == len(s)
    assert all(n % align == 0 for n in lengths[:-1])  # only the last worker's part is ragged
    together = Counter(
        (sh, r)
        for w in range(case["workers"])
        for c in s.plan(w, case["workers"], align).chunks()
        for sh, r in zip(c.shards.tolist(), c.rows.tolist())
    )
    assert together == Counter(records(s))
    assert [len(s.plan(w, case["workers"], align)) for w in range(case["workers"])] == lengths


@pytest.mark.parametrize("n", [65_537, 1_048_577])
def test_one_large_shard_yields_every_record_exactly_once(n: int) -> None:
    sampler = ShardSampler([n], 1, 0, seed=7, drop_last=True)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = np.fromiter(sampler, dtype=np.int64, count=len(sampler))
        assert len(sampler) == n
        assert np.array_equal(np.bincount(got, minlength=n), np.ones(n, dtype=np.int64))
        assert not np.array_equal(got[:1000], np.arange(1000))  # shuffled, not storage order
