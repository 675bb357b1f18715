"""Packing's invariants, property-tested (hypothesis) over document lengths, block lengths,
separators, ranks, workers, seeds, epochs, windows and read groups, without files: the
epoch's token line (sampler.packing) read through the packer (loader.tokens.packer), each
run's documents handed over as Arrow lists a few at a time, as the reader hands them.

The reference is brute force: every document of the epoch in the order of the whole
epoch's plan, laid end to end with its separators, cut every `length` tokens.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.loader.errors import StaleIndexError
from shardstream.loader.tokens.pack import Pack
from shardstream.loader.tokens.packer import pack_run
from shardstream.loader.tokens.rows import TokenRows
from shardstream.sampler.epoch import worker_span
from shardstream.sampler.packing import PackLine, blocks_per_rank, dropped
from shardstream.sampler.planning import span_plan

STRIDE = 1000  # token = STRIDE * document + place: every token names its place


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    sizes = draw(st.lists(st.integers(0, 12), min_size=1, max_size=7))
    n = sum(sizes)
    lengths = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    grouped = draw(st.booleans())
    groups = None
    if grouped:
        groups = []
        for m in sizes:
            cuts = sorted(draw(st.sets(st.integers(1, max(1, m - 1)), max_size=3))) if m > 1 else []
            bounds = [0, *[c for c in cuts if c < m], m] if m else []
            groups.append([b - a for a, b in itertools.pairwise(bounds)])
    return {
        "sizes": np.array(sizes, dtype=np.int64),
        "lengths": np.array(lengths, dtype=np.int64),
        "groups": groups,
        "pack": Pack(
            "t",
            draw(st.integers(1, 25)),
            eos=draw(st.sampled_from([None, -1])),
            bos=draw(st.sampled_from([None, -2])),
        ),
        "seed": draw(st.integers(0, 2**31)),
        "epoch": draw(st.integers(0, 5)),
        "shuffle": draw(st.booleans()),
        "window": draw(st.integers(1, 4)),
        "replicas": draw(st.integers(1, 5)),
        "workers": draw(st.integers(1, 3)),
        "part": draw(st.integers(1, 6)),
    }


def line_of(case: dict[str, Any]) -> PackLine:
    pack = case["pack"]
    return PackLine(
        case["sizes"],
        pack.places(case["lengths"]),
        seed=case["seed"],
        epoch=case["epoch"],
        shuffle=case["shuffle"],
        window=case["window"],
        groups=case["groups"],
    )


def docs_of(case: dict[str, Any]) -> list[list[int]]:
    return [[STRIDE * d + j for j in range(int(n))] for d, n in enumerate(case["lengths"])]


def read(case: dict[str, Any], line: PackLine, g0: int, g1: int) -> list[tuple[int, ...]]:
    """Blocks [g0, g1) as the dataset makes them: the run's documents in parts."""
    pack = case["pack"]
    run = line.run(g0, g1, pack.length)
    if run is None:
        return []
    docs = docs_of(case)
    offsets = np.cumsum(case["sizes"]) - case["sizes"]
    ids = [int(i) for c in run.plan.chunks(run.start, run.stop) for i in offsets[c.shards] + c.rows]
    k = case["part"]
    parts = (
        TokenRows(
            np.array([t for i in ids[a : a + k] for t in docs[i]], dtype=np.int64),
            np.array([len(docs[i]) for i in ids[a : a + k]], dtype=np.int64),
        )
        for a in range(0, len(ids), k)
    )
    out = []
    for tokens, positions, _ in pack_run(parts, pack, run, "test"):
        for row, pos in zip(tokens.tolist(), positions.tolist()):
            out.append(tuple(row))
            for t, p in zip(row, pos):  # each token at its place in its document
                if t >= 0:
                    assert p == t % STRIDE + int(pack.bos is not None)
    return out


def reference(case: dict[str, Any], line: PackLine) -> list[tuple[int, ...]]:
    """The whole epoch's blocks, brute force."""
    pack = case["pack"]
    n = int(case["sizes"].sum())
    plan = span_plan(
        line.line,
        0,
        n,
        seed=case["seed"],
        epoch=case["epoch"],
        shuffle=case["shuffle"],
        window=line.window,
        groups=case["groups"],
    )
    offsets = np.cumsum(case["sizes"]) - case["sizes"]
    docs = docs_of(case)
    stream: list[int] = []
    for c in plan.chunks():
        for i in offsets[c.shards] + c.rows:
            doc = docs[int(i)]
            if doc:
                stream += [pack.bos] * (pack.bos is not None) + doc
                stream += [pack.eos] * (pack.eos is not None)
    size = pack.length
    return [tuple(stream[a : a + size]) for a in range(0, len(stream) - size + 1, size)]


@settings(max_examples=250, deadline=None)
@given(cases())
def test_ranks_and_workers_read_the_epochs_blocks_once(case: dict[str, Any]) -> None:
    line = line_of(case)
    pack = case["pack"]
    whole = reference(case, line)
    assert len(whole) == line.total // pack.length
    replicas, workers = case["replicas"], case["workers"]
    n = blocks_per_rank(line.total, pack.length, replicas)
    assert dropped(line.total, pack.length, replicas) < pack.length * (replicas + 1)
    read_all = []
    for rank in range(replicas):
        mine = []
        for w in range(workers):
            lo, hi = worker_span(rank, n, w, workers)
            mine += read(case, line, lo, hi)
        assert len(mine) == n  # equal counts, known before reading
        read_all += mine
    assert read_all == whole[: replicas * n]
    tokens = [t for b in read_all for t in b if t >= 0]
    assert len(tokens) == len(set(tokens))  # no token twice an epoch


@settings(max_examples=150, deadline=None)
@given(cases(), st.data())
def test_a_run_from_any_block_is_the_rest(case: dict[str, Any], data: Any) -> None:
    """Resume: blocks [g, B) read on their own are the epoch's blocks from g on."""
    line = line_of(case)
    whole = reference(case, line)
    if not whole:
        return
    g = data.draw(st.integers(0, len(whole) - 1))
    end = data.draw(st.integers(g, len(whole)))
    assert read(case, line, g, end) == whole[g:end]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.lists(st.integers(0, 99), max_size=150)), max_size=9),
        min_size=1,
        max_size=4,
    ),
    st.data(),
)
def test_gathered_documents_are_what_arrow_takes(groups: list[Any], data: Any) -> None:
    """A part's documents gathered from several read groups (loader.tokens.rows) are the
    rows Arrow's take gives, short documents (a fancy index) and long ones (a copy each)
    alike; null rows are empty documents."""
    import pyarrow as pa

    from shardstream.loader.tokens.rows import TokenBlock, gather_rows

    tables = [pa.table({"t": pa.array(g, pa.list_(pa.int32()))}) for g in groups]
    blocks = [TokenBlock([t], "t") for t in tables]
    picks = [(b, r) for b, g in enumerate(groups) for r in range(len(g))]
    order = data.draw(st.permutations(picks))
    which = np.array([b for b, _ in order], dtype=np.int64)
    rows = np.array([r for _, r in order], dtype=np.int64)
    got = gather_rows(blocks, which, rows)
    want = [groups[b][r] or [] for b, r in order]
    assert got.lengths.tolist() == [len(w) for w in want]
    assert got.values.tolist() == [t for w in want for t in w]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 400), min_size=1, max_size=4),
    st.lists(st.integers(1, 20), min_size=4, max_size=4),
    st.integers(1, 6),
    st.integers(0, 4),
)
def test_token_mixtures_count_blocks_by_weight(
    blocks: list[int], weights: list[int], replicas: int, epoch: int
) -> None:
    """A packed mixture's planner (loader.tokens.mixing: one pseudo-shard of a pass's
    blocks a stream, in order, drop_last): every rank takes the same c_k blocks of stream
    k an epoch, within one block of its weight's share (a block is `length` tokens, so the
    tokens' share is within one block too), and each rank's blocks of a pass are one
    contiguous run of the pass's block line, disjoint across ranks."""
    from shardstream.sampler import MixtureSampler

    weights = weights[: len(blocks)]
    if any(b < replicas for b in blocks):
        return  # refused: a stream with fewer blocks a pass than ranks
    epoch_size = sum(blocks)
    names = [f"s{k}" for k in range(len(blocks))]
    taken: dict[tuple[int, int], list[tuple[int, int]]] = {}
    counts = None
    for rank in range(replicas):
        m = MixtureSampler(
            [[b] for b in blocks],
            weights,
            epoch_size,
            replicas,
            rank,
            shuffle=False,
            drop_last=True,
            names=names,
        )
        m.set_epoch(epoch)
        length = epoch_size // replicas
        assert counts is None or m.epoch_counts() == counts
        counts = m.epoch_counts()
        for k, c in enumerate(counts):
            assert abs(c - length * weights[k] / sum(weights)) < 1
        part = m.part(0, len(m))
        for k, pieces in enumerate(part.pieces):
            for p in pieces:
                base = int(p.plan.starts[0])
                assert p.plan.shards.tolist() == [0] and p.plan.keys is None
                taken.setdefault((k, p.pass_index), []).append((base + p.start, base + p.stop))
    for runs in taken.values():  # within a pass, ranks' block ranges never overlap
        runs.sort()
        assert all(a1 <= b0 for (_, a1), (b0, _) in itertools.pairwise(runs))


def test_documents_that_differ_from_the_counts_are_a_stale_index() -> None:
    """A run whose documents hold other token counts than the index's (a shard rewritten
    with the same size and version, counts from another file) is a StaleIndexError
    naming the run, never blocks cut in the wrong places."""
    pack = Pack("t", 4, eos=-1)
    lengths = np.array([3, 5, 2, 6], dtype=np.int64)
    line = PackLine(np.array([4]), pack.places(lengths), seed=0, epoch=0, shuffle=False, window=1)
    run = line.run(0, line.total // 4, 4)
    assert run is not None
    for wrong in ([3, 5, 2, 7], [3, 5, 2, 2]):
        docs = [list(range(n)) for n in wrong]
        part = TokenRows(
            np.array([t for d in docs for t in d], dtype=np.int64),
            np.array(wrong, dtype=np.int64),
        )
        with pytest.raises(StaleIndexError, match=r"blocks 0\.\.4"):
            list(pack_run([part], pack, run, "blocks 0..4 (shards x)"))
