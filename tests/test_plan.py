"""Plans over read groups: each piece read group by group, the schedule of the groups, and
the randomness and mixing the grouped order keeps."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler import ShardSampler, distinct_per_batch
from shardstream.sampler.keyed import unit_floats
from shardstream.sampler.plan import Plan, hash_order, stable_order


def split(size: int, cuts: list[int]) -> list[int]:
    """Group sizes of a shard of `size` records cut at the given rows."""
    bounds = sorted({c for c in cuts if 0 < c < size} | {0, size})
    return [b - a for a, b in itertools.pairwise(bounds)] if size else []


grouped = st.integers(0, 60).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(1, max(1, n - 1)), max_size=6))
)
cases = st.fixed_dictionaries(
    {
        "shards": st.lists(grouped, min_size=1, max_size=8),
        "world": st.integers(1, 4),
        "workers": st.integers(1, 3),
        "seed": st.integers(0, 2**32),
        "epoch": st.integers(0, 3),
        "shuffle": st.booleans(),
        "drop_last": st.booleans(),
        "window": st.integers(1, 4),
    }
)


def records(plan: Plan, start: int = 0, stop: int | None = None, size: int = 1 << 16) -> list:
    """(piece, shard, row, group) of each record of the plan, in reading order."""
    out: list = []
    for c in plan.chunks(start, stop, size):
        assert c.groups is not None
        out += zip(c.pieces.tolist(), c.shards.tolist(), c.rows.tolist(), c.groups.tolist())
    return out


@settings(max_examples=200, deadline=None)
@given(case=cases)
def test_groups_keep_the_records_and_are_read_one_after_the_other(case: dict) -> None:
    sizes = [n for n, _ in case["shards"]]
    groups = [split(n, cuts) for n, cuts in case["shards"]]
    for rank in range(case["world"]):
        args = (case["world"], rank, case["shuffle"], case["seed"], case["drop_last"])
        plain = ShardSampler(sizes, *args, window=case["window"])
        mine = ShardSampler(sizes, *args, window=case["window"], groups=groups)
        for s in (plain, mine):
            s.set_epoch(case["epoch"])
        for w in range(case["workers"]):
            got = records(mine.plan(w, case["workers"]))
            want = records(plain.plan(w, case["workers"]))
            # the same records (the same pieces), in another order inside each piece
            assert Counter(r[1:3] for r in got) == Counter(r[1:3] for r in want)
            plan = mine.plan(w, case["workers"])
            for piece in set(r[0] for r in got):
                seq = [(row, g) for p, _, row, g in got if p == piece]
                # the group holding each row, and each group read in one stretch
                for row, g in seq:
                    assert plan.group_rows(piece, g)[0] <= row < plan.group_rows(piece, g)[1]
                runs = [g for i, (_, g) in enumerate(seq) if i == 0 or seq[i - 1][1] != g]
                assert len(runs) == len(set(runs))
                if not case["shuffle"]:  # storage order
                    assert [row for row, _ in seq] == sorted(row for row, _ in seq)
            # chunking never changes the order
            assert records(plan, size=7) == got


@settings(max_examples=150, deadline=None)
@given(case=cases, data=st.data())
def test_group_schedule_lists_the_groups_a_stretch_reads_in_the_order_it_needs_them(
    case: dict, data: st.DataObject
) -> None:
    sizes = [n for n, _ in case["shards"]]
    groups = [split(n, cuts) for n, cuts in case["shards"]]
    s = ShardSampler(sizes, 1, 0, True, case["seed"], False, case["window"], groups=groups)
    plan = s.plan()
    before = plan.block_starts()
    for b in range(len(plan.blocks())):
        n = int(before[b + 1] - before[b])
        lo = data.draw(st.integers(0, n))
        hi = data.draw(st.integers(lo, n))
        schedule = plan.group_schedule(b, lo, hi)
        assert len(schedule) == len(set(schedule))
        seen = [(p, g) for p, _, _, g in records(plan, int(before[b]) + lo, int(before[b]) + hi)]
        first = {}
        for i, key in enumerate(seen):
            first.setdefault(key, i)
        # every group read is scheduled; only groups at the stretch's edges may be extra
        assert set(first) <= set(schedule)
        assert len(set(schedule) - set(first)) <= 2 * (plan.window)
        # in need order, up to the jitter of the merge: record j of a piece of m records
        # lies anywhere in the j-th of m equal slots of a block of n, so two of its records
        # in a row lie up to 2n/m apart, and a group already open at `lo` may first be read
        # that late in the stretch (hypothesis found 17 > n/m + window + 1 = 16.4)
        needed = [k for k in schedule if k in first]
        for a, c in itertools.pairwise(needed):
            m = int(plan.sizes[a[0]])
            assert first[a] <= first[c] + 2 * n / m + plan.window + 1


def test_one_group_a_piece_is_the_order_without_groups() -> None:
    sizes = [37, 120, 64, 250]
    plain = ShardSampler(sizes, 2, 1, seed=3)
    one = ShardSampler(sizes, 2, 1, seed=3, groups=[[n] for n in sizes])
    assert list(plain) == list(one)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def in_shard_measures(groups: list | None, shards: int = 64) -> tuple[float, float, float]:
    """(mean signed, mean absolute rank correlation between a record's row and its place in
    its shard's stream, distinct shards per 64) for one rank over 10,000-record shards."""
    s = ShardSampler([10_000] * shards, 1, 0, seed=5, groups=groups)
    rows, ids = [], []
    for c in s.plan().chunks():
        rows.append(c.rows)
        ids.append(c.shards)
    row, shard = np.concatenate(rows), np.concatenate(ids)
    rhos = [spearman(row[shard == k], np.arange(int((shard == k).sum()))) for k in range(shards)]
    return float(np.mean(rhos)), float(np.mean(np.abs(rhos))), distinct_per_batch(shard, 64)


def test_grouped_order_keeps_in_shard_randomness_unbiased_and_mixing_unchanged() -> None:
    """Read group by group, a shard's records still land anywhere in its span: no drift
    from its first rows to its last (signed correlation about 0). How far a shard's
    stream follows its storage order by chance shrinks as 1/sqrt(groups): 5 groups of
    2,000 give |rho| about 0.4, 50 of 200 about 0.1; one permutation of the whole shard
    about 0.01. Batches hold about `window` shards either way."""
    signed_w, abs_w, mix_w = in_shard_measures(None)
    signed_5, abs_5, mix_5 = in_shard_measures([[2000] * 5] * 64)
    signed_50, abs_50, mix_50 = in_shard_measures([[200] * 50] * 64)
    assert abs_w < 0.05
    for signed in (signed_w, signed_5, signed_50):
        assert abs(signed) < 0.1
    assert abs_5 < 0.5 and abs_50 < 0.15
    assert abs_50 < abs_5 / 2
    for mixing in (mix_5, mix_50):
        assert abs(mixing - mix_w) < 0.1 and mixing > 7.5


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[10], [5, 4]], r"groups of shard 1 must be positive record counts summing to its 10"),
        ([[10]], r"groups gives 1 shards, the sizes 2"),
        ([[10], [10, 0]], r"groups of shard 1 must be positive"),
    ],
)
def test_bad_groups_are_named(groups: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardSampler([10, 10], 1, 0, groups=groups)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(-(2**40), 2**40),
    st.sampled_from([1, 2, 255, 256, 257, 65_535, 65_536, 65_537, 2**40]),
    st.integers(0, 3_000),
    st.integers(0, 2**32 - 1),
)
def test_stable_order_is_numpys_stable_argsort(lo: int, span: int, n: int, seed: int) -> None:
    """The radix path (values within 8 or 16 bits of their least) and the general one give
    numpy's stable argsort exactly: ties in their order of appearance."""
    values = np.random.default_rng(seed).integers(lo, lo + span, n, dtype=np.int64)
    got = stable_order(values)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argsort(values, kind="stable"))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5_000), st.integers(0, 2**64 - 1), st.integers(0, 50))
def test_hash_order_is_numpys_stable_argsort(n: int, key: int, tied: int) -> None:
    """A plan's in-group order sorts keyed hashes by numpy's quicksort: the same order as
    the stable sort the golden ids were made with, also where values tie (copied over
    others here; the stable sort then decides)."""
    values = unit_floats(np.arange(n), key)
    if n > 1 and tied:
        rng = np.random.default_rng(tied)
        values[rng.integers(0, n, tied)] = values[rng.integers(0, n, tied)]
    got = hash_order(values)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argsort(values, kind="stable"))


def test_a_run_ending_inside_a_block_makes_little_more_than_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """chunks(start, stop) is the whole order's [start, stop), and makes the order of
    little more than those records: a mixture's pass that takes a few thousand records of
    a 40,000-record block made the whole block's order (and each piece's place in it
    twice, to schedule its groups). `_records_before` finds a record's place the same way
    whatever slice it looks in."""
    from shardstream.sampler import plan as plan_module

    sizes = [5_000] * 8 + [3_000] * 3
    groups = [split(n, list(range(700, n, 700))) for n in sizes]
    plan = ShardSampler(sizes, seed=11, groups=groups).plan()
    full = records(plan)
    made: list[int] = []
    real = Plan._chunk

    def counted(self: Plan, *args: object, **kwargs: object) -> object:
        out = real(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(len(out))  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(Plan, "_chunk", counted)
    for start, stop in [(0, 100), (0, 2_621), (17_000, 26_830), (39_990, 40_100), (0, len(plan))]:
        made.clear()
        assert records(plan, start, stop) == full[start:stop]
        assert sum(made) <= 2 * (stop - start) + 2_000, (start, stop, sum(made))
    p0, p1 = plan.blocks()[0]
    n = int(plan.sizes[p0:p1].sum())  # 34,000-40,000
    for at in [1, 999, 8_191, 8_192, n // 2, n - 1]:
        found = {}
        for locate in (97, 8_192, 1 << 16):
            monkeypatch.setattr(plan_module, "LOCATE", locate)
            found[locate] = [plan._records_before(p0, p1, at, surely=s) for s in (True, False)]
        assert found[97] == found[8_192] == found[1 << 16], at
        surely, possibly = found[8_192]
        assert all(a <= b for a, b in zip(surely, possibly)), at
