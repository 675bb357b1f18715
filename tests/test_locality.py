"""locality="node": each node keeps its records every epoch; DESIGN.md's invariants 1, 2
and 7 hold as they are, 4 within each node (DESIGN.md, "Multi-epoch: cache and locality")."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset
from shardstream.sampler import ShardSampler, distinct_per_batch

from .datagen import record_id, write_dataset
from .helpers import check_resume, take


def epoch_of(sizes, world, local, seed, epoch, drop_last, workers=1):
    """Per rank, the global record ids it reads in the epoch (its workers' parts joined)."""
    out = []
    for rank in range(world):
        s = ShardSampler(sizes, world, rank, seed=seed, drop_last=drop_last, local_world_size=local)
        s.set_epoch(epoch)
        ids: list[int] = []
        for w in range(workers):
            for c in s.plan(w, workers).chunks():
                ids += (s.offsets[c.shards] + c.rows).tolist()
        out.append(ids)
    return out


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=25).filter(lambda s: sum(s) > 0),
    nodes=st.integers(1, 3),
    local=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    drop_last=st.booleans(),
    workers=st.integers(1, 3),
)
def test_nodes_keep_their_records_and_the_invariants_hold(
    sizes, nodes, local, seed, drop_last, workers
) -> None:
    world = nodes * local
    n = sum(sizes)
    if drop_last and n < world:
        return
    kept = None
    for epoch in range(3):
        ranks = epoch_of(sizes, world, local, seed, epoch, drop_last, workers)
        length = len(ShardSampler(sizes, world, 0, drop_last=drop_last))
        # 1: every rank the same count, as without locality
        assert [len(r) for r in ranks] == [length] * world
        counts = Counter(i for r in ranks for i in r)
        if drop_last:  # 2: nothing twice
            assert max(counts.values()) == 1
        else:  # 2: everything at least once, only the padding repeats
            assert set(counts) == set(range(n))
            assert sum(counts.values()) - n == world * length - n
        per_node = [
            Counter(i for r in ranks[k * local : (k + 1) * local] for i in r) for k in range(nodes)
        ]
        if kept is None:
            kept = per_node
        assert per_node == kept, f"epoch {epoch}: a node's records changed"


def test_each_epoch_reshuffles_inside_the_node() -> None:
    """Invariant 4 within a node: the node's ranks get its records in another order and
    another split between them each epoch."""
    sizes = [50] * 40
    e0 = epoch_of(sizes, 4, 2, 7, 0, True)
    e1 = epoch_of(sizes, 4, 2, 7, 1, True)
    for rank in range(4):
        assert e0[rank] != e1[rank]
    assert set(e0[0]) != set(e1[0])  # the node's records move between its ranks
    assert set(e0[0] + e0[1]) == set(e1[0] + e1[1])


def test_locality_costs_little_randomness_in_a_batch() -> None:
    """Batches mix as many shards as with the global shuffle (the window interleaves the
    same way inside a node)."""
    sizes = [1000] * 64

    def mixing(local):
        s = ShardSampler(sizes, 4, 1, seed=3, local_world_size=local)
        s.set_epoch(2)
        return distinct_per_batch(np.concatenate([c.shards for c in s.plan().chunks()]), 64)

    assert abs(mixing(2) - mixing(None)) < 0.5
    assert mixing(2) > 7


def test_resume_with_locality_yields_the_rest() -> None:
    """Invariant 7."""
    sizes = [30, 0, 41, 17, 35, 9]
    check_resume(lambda: ShardSampler(sizes, 4, 3, seed=1, local_world_size=2), [1, 5, 20], epoch=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"local_world_size": 3}, r"local_world_size=3 must divide num_replicas=4"),
        ({"local_world_size": 0}, r"local_world_size must be"),
    ],
)
def test_bad_local_world_sizes_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ShardSampler([10, 10], 4, 0, **kwargs)


@pytest.fixture
def shards(tmp_path):
    from fsspec.implementations.local import LocalFileSystem

    write_dataset(LocalFileSystem(), str(tmp_path / "d"), "parquet", sizes=[60, 0, 45, 33, 70, 12])
    return str(tmp_path / "d")


def test_dataset_locality_options_are_checked(shards, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="locality must be None or 'node'"):
        StreamingDataset(shards, locality="rack")
    with pytest.raises(ValueError, match="needs local_world_size"):
        StreamingDataset(shards, num_replicas=4, rank=0, locality="node")
    with pytest.raises(ValueError, match="must divide the world size 4"):
        StreamingDataset(shards, num_replicas=4, rank=0, locality="node", local_world_size=3)
    with pytest.raises(ValueError, match="cache_limit needs cache_dir"):
        StreamingDataset(shards, cache_limit="1GB")
    with pytest.raises(ValueError, match="cache_limit must be bytes"):
        StreamingDataset(shards, cache_dir="c", cache_limit="lots")
    with pytest.raises(ValueError, match="cache_dir must be a local folder"):
        StreamingDataset(shards, cache_dir="s3://b/c")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ds = StreamingDataset(shards, num_replicas=4, rank=3, locality="node")
    assert ds.sampler.local_world_size == 2


def test_dataset_with_locality_reads_what_the_sampler_plans(shards) -> None:
    for rank in range(4):
        ds = StreamingDataset(
            shards, num_replicas=4, rank=rank, seed=2, locality="node", local_world_size=2
        )
        ds.set_epoch(1)
        s = ShardSampler(ds.index, 4, rank, seed=2, local_world_size=2)
        s.set_epoch(1)
        assert sorted(record_id(r) for r in ds) == sorted(s)


def test_elastic_resume_with_locality_reads_every_record_once(shards) -> None:
    """2 nodes of 2 ranks stop mid-epoch; 1 node of 3 ranks reads the rest: every record
    once (drop_last), and the next epoch cuts the 3 ranks' node anew."""

    def ds(world, rank, local):
        return StreamingDataset(
            shards,
            num_replicas=world,
            rank=rank,
            seed=4,
            drop_last=True,
            batch_size=5,
            locality="node",
            local_world_size=local,
        )

    seen: list[int] = []
    states = []
    for rank in range(4):
        d = ds(4, rank, 2)
        d.set_epoch(1)
        got = take(DataLoader(d, batch_size=None, num_workers=2), 3)
        seen += [int(i) for b in got for i in b["id"]]
        states.append(d.consumed_state(3, 2))
    assert states[0]["local_world_size"] == 2
    for rank in range(3):
        d = ds(3, rank, 3)
        d.load_state_dict(states[rank if rank < 3 else 0])
        seen += [int(i) for b in DataLoader(d, batch_size=None, num_workers=2) for i in b["id"]]
    counts = Counter(seen)
    assert max(counts.values()) == 1
    n = sum([60, 0, 45, 33, 70, 12])
    assert len(counts) >= n - 4 * 5  # drop_last leaves out fewer than a batch a rank
    d = ds(3, 0, 3)
    d.set_epoch(2)
    assert len(list(d)) == len(d)


def test_a_mixture_keeps_each_streams_node_records(tmp_path) -> None:
    """Per stream: with natural proportions an epoch is one pass of each stream, and each
    node reads the same records of each stream every epoch, equal counts on all ranks."""
    from fsspec.implementations.local import LocalFileSystem

    from shardstream.loader import Stream

    fs = LocalFileSystem()
    write_dataset(fs, str(tmp_path / "a"), "parquet", sizes=[60, 45, 33])
    write_dataset(fs, str(tmp_path / "b"), "parquet", sizes=[70, 12, 50, 20])
    streams = [Stream(str(tmp_path / "a")), Stream(str(tmp_path / "b"))]
    kept = None
    for epoch in range(3):
        ranks = []
        for rank in range(4):
            ds = StreamingDataset(
                streams,
                num_replicas=4,
                rank=rank,
                seed=1,
                drop_last=True,
                locality="node",
                local_world_size=2,
            )
            ds.set_epoch(epoch)
            ranks.append([(r["__stream__"], record_id(r)) for r in ds])
        assert len({len(r) for r in ranks}) == 1
        flat = [x for r in ranks for x in r]
        assert len(flat) == len(set(flat))
        nodes = [sorted(ranks[0] + ranks[1]), sorted(ranks[2] + ranks[3])]
        kept = kept or nodes
        assert nodes == kept
