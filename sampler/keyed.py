"""Keyed hashing and keyed permutations: the only randomness the sampler uses.

Everything here is integer arithmetic on 64-bit words (plus one correctly rounded float
division in `unit_floats`), so the same key gives the same numbers on every machine and
with every numpy version. That is why the sampler does not use numpy's or torch's random
generators, whose streams are not promised to stay the same across releases.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["derive_key", "derive_keys", "mix64", "permute", "unit_floats"]

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
FEISTEL_ROUNDS = 6
_TABLE = 1 << 10  # domains this small are permuted through a table of the whole network

U64Array = npt.NDArray[np.uint64]
I64Array = npt.NDArray[np.int64]


def _mix64_int(z: int) -> int:
    """splitmix64's finalizer on a Python int (the scalar twin of `mix64`)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from a sequence of integers, order-sensitive.

    Each part is taken modulo 2**64 (so negative seeds work). Unlike `seed + epoch`,
    (1, 0) and (0, 1) give unrelated keys.
    """
    h = 0x5348415244535452  # "SHARDSTR"
    for p in parts:
        h = _mix64_int(h ^ ((int(p) + _GOLDEN) & MASK64))
    return h


def mix64(x: U64Array) -> U64Array:
    """splitmix64's finalizer, elementwise on a uint64 array (wrapping arithmetic)."""
    z = x ^ (x >> np.uint64(30))
    z = z * np.uint64(_M1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_M2)
    out: U64Array = z ^ (z >> np.uint64(31))
    return out


def unit_floats(x: npt.ArrayLike, key: int) -> npt.NDArray[np.float64]:
    """Keyed pseudo-random floats in [0, 1), one per element of the integer array `x`."""
    h = mix64(np.asarray(x, dtype=np.uint64) ^ np.uint64(key))
    # 53 random bits, scaled exactly to [0, 1).
    return (h >> np.uint64(11)).astype(np.float64) * (2.0**-53)


def _feistel(v: U64Array, half: int, round_keys: list[np.uint64]) -> U64Array:
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = v >> shift, v & mask
    for rk in round_keys:
        left, right = right, left ^ (mix64(right ^ rk) & mask)
    return (left << shift) | right


def permute(x: npt.ArrayLike, n: int, key: int) -> I64Array:
    """pi(x) for each element of `x`, where pi is a bijection of [0, n) chosen by `key`.

    A balanced Feistel network over the smallest even number of bits covering n, with
    cycle-walking to stay inside [0, n). It needs no O(n) table: any single position of a
    permutation of 10**12 elements costs a few dozen integer operations.
    """
    xs = np.asarray(x, dtype=np.int64)
    if xs.size and (xs.min() < 0 or xs.max() >= n):
        raise ValueError(f"permute: positions must lie in [0, {n}), got {xs.min()}..{xs.max()}")
    if n <= 1:
        return xs.copy()
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    round_keys = [np.uint64(derive_key(key, r)) for r in range(FEISTEL_ROUNDS)]
    if 1 << (2 * half) <= max(_TABLE, xs.size):
        # a small domain, or no larger than the positions asked: the network over all of
        # it once (walking the positions would evaluate about as many), then each cycle
        # walked by lookups (the same bijection, a few numpy calls instead of a network a
        # step)
        network = _feistel(np.arange(1 << (2 * half), dtype=np.uint64), half, round_keys)
        table: I64Array = network.astype(np.int64)
        z: I64Array = table[xs]
        outside = np.flatnonzero(z >= n)
        while outside.size:
            z[outside] = table[z[outside]]
            outside = outside[z[outside] >= n]
        return z
    y = xs.astype(np.uint64)
    # (k,) positions whose value still lies outside [0, n): walk them along their cycle.
    pending = np.arange(y.size)
    while pending.size:
        y[pending] = _feistel(y[pending], half, round_keys)
        pending = pending[y[pending] >= np.uint64(n)]
    return y.astype(np.int64)


def derive_keys(prefix: int, *parts: npt.ArrayLike) -> U64Array:
    """Vectorized `derive_key`: ``derive_keys(derive_key(*a), *b)[i] == derive_key(*a, *b_i)``.

    Lets a plan key thousands of pieces without a Python loop per piece.
    """
    arrays = [np.asarray(p).astype(np.int64).astype(np.uint64) for p in parts]
    shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
    h = np.full(shape, prefix, dtype=np.uint64)
    for a in arrays:
        h = mix64(h ^ (a + np.uint64(_GOLDEN)))
    return h
