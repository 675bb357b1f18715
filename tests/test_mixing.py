"""The stratified merge: one global order, whatever the chunking or the seek."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.sampler.keyed import unit_floats
from shardstream.sampler.mixing import block_order, distinct_per_batch


def reference_order(sizes: list[int], keys: list[int]) -> list[tuple[int, int]]:
    """Sort every record of the block by t = (j + u) / m, ties by piece."""
    recs = []
    for i, (m, key) in enumerate(zip(sizes, keys)):
        j = np.arange(m)
        t = (j + unit_floats(j, key)) / m
        recs += [(float(tt), i, int(jj)) for tt, jj in zip(t, j)]
    return [(i, j) for _, i, j in sorted(recs)]


def flatten(chunks) -> list[tuple[int, int]]:
    return [(int(p), int(j)) for piece, js in chunks for p, j in zip(piece, js)]


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    seed=st.integers(0, 2**63),
    chunk=st.integers(1, 200),
    data=st.data(),
)
def test_chunked_seekable_merge_equals_one_sort(sizes, seed, chunk, data) -> None:
    keys = [seed + 7 * i for i in range(len(sizes))]
    want = reference_order(sizes, keys)
    assert flatten(block_order(sizes, keys, chunk=chunk)) == want
    skip = data.draw(st.integers(0, sum(sizes)))
    assert flatten(block_order(sizes, keys, skip=skip, chunk=chunk)) == want[skip:]


def test_each_piece_keeps_its_own_order_and_is_spread_out() -> None:
    sizes, keys = [1000, 10, 500], [1, 2, 3]
    order = flatten(block_order(sizes, keys, chunk=97))
    for i, m in enumerate(sizes):
        js = [j for p, j in order if p == i]
        assert js == list(range(m))
    # the 10-record piece is spread over the block, not bunched at one end
    where = [k for k, (p, _) in enumerate(order) if p == 1]
    assert where[0] < 200 and where[-1] > 1310 - 200


def test_distinct_per_batch() -> None:
    assert distinct_per_batch([0] * 128, 64) == 1.0
    assert distinct_per_batch(list(range(64)) * 2, 64) == 64.0
    assert distinct_per_batch([0, 1] * 32 + [5] * 64, 64) == 1.5
    assert np.isnan(distinct_per_batch([1, 2], 64))
