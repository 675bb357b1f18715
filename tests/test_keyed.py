"""Keyed hashing and permutations: bijective, deterministic, keyed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler.keyed import derive_key, derive_keys, mix64, permute, unit_floats


@pytest.mark.parametrize("n", [*range(0, 70), 255, 256, 257, 1000, 4097, 65536, 99991])
def test_permute_is_a_bijection(n: int) -> None:
    out = permute(np.arange(n), n, key=derive_key(7, n))
    assert sorted(out.tolist()) == list(range(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 10**15), key=st.integers(0, 2**64 - 1))
def test_permute_is_injective_on_samples_of_huge_domains(n: int, key: int) -> None:
    xs = np.unique(np.random.default_rng(key % 2**32).integers(0, n, size=200))
    ys = permute(xs, n, key)
    assert ys.min() >= 0 and ys.max() < n
    assert np.unique(ys).size == xs.size
    # pointwise: each element permutes the same alone as in a batch (no hidden state)
    assert permute(xs[:1], n, key)[0] == ys[0]


def _walked(x: int, n: int, key: int) -> int:
    """The permutation's definition, one position at a time: a balanced Feistel network of
    6 rounds over the smallest even number of bits covering n, applied again while the
    value lies outside [0, n)."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    rounds = [derive_key(key, r) for r in range(6)]

    def network(v: int) -> int:
        left, right = v >> half, v & mask
        for rk in rounds:
            mixed = int(mix64(np.array([right ^ rk], dtype=np.uint64))[0])
            left, right = right, left ^ (mixed & mask)
        return (left << half) | right

    y = network(x)
    while y >= n:
        y = network(y)
    return y


@pytest.mark.parametrize("n", [3, 17, 1000, 1024, 5000, 1 << 14, 70000])
def test_permute_is_the_network_walked_step_by_step(n: int) -> None:
    """Small domains are permuted through a table of the whole network, others walk it
    position by position: either way the definition's values."""
    key = derive_key(11, n)
    whole = permute(np.arange(n), n, key)
    picks = np.random.default_rng(n).integers(0, n, size=40)
    assert whole[picks].tolist() == [_walked(int(x), n, key) for x in picks]
    assert permute(picks, n, key).tolist() == whole[picks].tolist()


def test_permute_depends_on_key_and_moves_elements() -> None:
    n = 1000
    a, b = permute(np.arange(n), n, 1), permute(np.arange(n), n, 2)
    assert not np.array_equal(a, b)
    assert np.count_nonzero(a == np.arange(n)) < 20  # a random permutation fixes ~1 point


def test_permute_rejects_positions_outside_the_domain() -> None:
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        permute([10], 10, 0)


def test_derive_key_is_order_sensitive_and_not_a_sum() -> None:
    assert derive_key(1, 0) != derive_key(0, 1)
    assert derive_key(0, 2) != derive_key(1, 1)
    assert derive_key(-1) == derive_key(2**64 - 1)  # parts are taken modulo 2**64
    assert 0 <= derive_key(5, 6) < 2**64


def test_derive_keys_matches_the_scalar_version() -> None:
    a, b = np.array([0, 5, 17, 2**40]), np.array([3, 0, 9, 1])
    got = derive_keys(derive_key(11, 12), a, b)
    want = [derive_key(11, 12, int(x), int(y)) for x, y in zip(a, b)]
    assert got.tolist() == want


def test_unit_floats_lie_in_the_unit_interval_and_look_uniform() -> None:
    u = unit_floats(np.arange(100_000), key=3)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01


# n just past a power of two is where a widely used Feistel index shuffle loses one index
# (its domain of 2**k values is walked wrongly at the boundary); 2 is the smallest domain
# that is permuted at all
PINNED_N = [2, 65_536, 65_537, 1_048_577]


@pytest.mark.parametrize("n", PINNED_N)
@pytest.mark.parametrize("key", [0, 1, derive_key(3, 2), 2**64 - 1])
def test_permute_hits_every_position_exactly_once_at_power_of_two_edges(n: int, key: int) -> None:
    out = permute(np.arange(n), n, key)
    assert out.min() >= 0 and out.max() < n
    assert np.array_equal(np.bincount(out, minlength=n), np.ones(n, dtype=np.int64))
