"""Resume mid-epoch (invariant 7): exactly the items not yet yielded, in the same order."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.sampler.resume import resume_point

from .datagen import SIZES, record_id, write_dataset
from .helpers import check_resume

SIZES_TOTAL = sum(SIZES)


def round_robin(counts: list[int]) -> list[int]:
    """What torch's DataLoader does: the worker of each item, taking from each
    non-exhausted worker in turn, starting with worker 0."""
    left, order = list(counts), []
    for w in itertools.cycle(range(len(counts))):
        if not any(left):
            return order
        if left[w]:
            left[w] -= 1
            order.append(w)
    raise AssertionError("unreachable")


@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=5), data=st.data())
def test_resume_point_matches_a_round_robin(counts: list[int], data: st.DataObject) -> None:
    consumed = data.draw(st.integers(0, sum(counts)))
    skips, due = resume_point(counts, consumed)
    order = round_robin(counts)
    assert skips == [order[:consumed].count(w) for w in range(len(counts))]
    # a new loader starting at worker 0, with worker w playing worker (due + w), goes on
    # exactly as the old one would have
    left = [n - s for n, s in zip(counts, skips)]
    rotated = [left[(due + w) % len(counts)] for w in range(len(counts))]
    assert [(due + w) % len(counts) for w in round_robin(rotated)] == order[consumed:]


def test_resume_point_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"consumed must lie in \[0, 5\], got 6"):
        resume_point([2, 3], 6)


def key(item: Any) -> Any:
    """Records by id; batches by their ids."""
    if isinstance(item, dict) and "id" in item and not isinstance(item["id"], int):
        return tuple(int(i) for i in item["id"])
    if isinstance(item, dict) and isinstance(item.get("__key__"), list):
        return tuple(item["__key__"])
    return record_id(item)


@pytest.fixture(params=["parquet", "tar"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    write_dataset(fsspec.filesystem("file"), str(tmp_path), request.param)
    return str(tmp_path)


@pytest.mark.parametrize("batch_size", [None, 7])
def test_resume_in_a_plain_loop(url: str, batch_size: int | None) -> None:
    def make() -> StreamingDataset:
        return StreamingDataset(url, num_replicas=2, rank=1, seed=4, batch_size=batch_size)

    n = len(make())
    check_resume(make, positions=[1, n // 2, n - 1], epoch=3, key=key)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("batch_size", [None, 5])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_resume_through_a_dataloader_from_a_consumed_count(
    url: str, batch_size: int | None, workers: int
) -> None:
    def loader(ds: StreamingDataset) -> DataLoader:
        return DataLoader(ds, batch_size=None, num_workers=workers)

    ds = StreamingDataset(url, num_replicas=3, rank=2, seed=1, batch_size=batch_size)
    ds.set_epoch(2)
    full = [key(x) for x in loader(ds)]
    assert len(full) == len(ds)
    for k in (0, 1, len(full) // 2, len(full) - 1, len(full)):
        again = StreamingDataset(url, num_replicas=3, rank=2, seed=1, batch_size=batch_size)
        again.set_epoch(2)
        state = again.consumed_state(k, num_workers=workers)
        b = batch_size or 0
        assert state == {
            "epoch": 2,
            "position": k,
            "num_workers": workers,
            "num_replicas": 3,
            "batch_size": b,
            "num_records": 125,
        }
        assert json.loads(json.dumps(state)) == state
        fresh = StreamingDataset(url, num_replicas=3, rank=2, seed=1, batch_size=batch_size)
        fresh.load_state_dict(state)
        fresh.set_epoch(2)
        assert [key(x) for x in loader(fresh)] == full[k:], k


def ids_of(item: Any) -> list[int]:
    """Record ids of a record or a batch."""
    if isinstance(item, dict) and "id" in item and not isinstance(item["id"], int):
        return [int(i) for i in item["id"]]
    if isinstance(item, dict) and isinstance(item.get("__key__"), list):
        return [int(k.removeprefix("sample")) for k in item["__key__"]]
    return [record_id(item)]


def run_ranks(
    url: str,
    world: int,
    workers: int,
    batch: int | None,
    state: Any,
    consume: int | None,
    drop_last: bool = True,
) -> tuple[list[int], dict[str, Any], list[int]]:
    """Every rank of a job: load `state`, read `consume` items (all when None).
    Returns (record ids read, rank 0's consumed state, items per rank)."""
    ids: list[int] = []
    counts = []
    saved: dict[str, Any] = {}
    for rank in range(world):
        ds = StreamingDataset(
            url, num_replicas=world, rank=rank, seed=2, batch_size=batch, drop_last=drop_last
        )
        if state is not None:
            ds.load_state_dict(state)
        ds.set_epoch(1)
        n = 0
        for item in DataLoader(ds, batch_size=None, num_workers=workers):
            if consume is not None and n == consume:
                break
            ids += ids_of(item)
            n += 1
        counts.append(n)
        assert consume is not None or n == len(ds)  # len() is what the rank yields
        if rank == 0:
            saved = ds.consumed_state(n, workers)
    return ids, saved, counts


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((3, 2, None), (2, 0, None)),
        ((3, 0, 4), (2, 2, 4)),
        ((2, 2, 5), (3, 1, 3)),  # other ranks, workers and batch size at once
        ((4, 1, None), (4, 2, None)),  # workers alone change
    ],
)
def test_elastic_resume_reads_every_record_once(url: str, before: tuple, after: tuple) -> None:
    (r0, w0, b0), (r1, w1, b1) = before, after
    head, state, _ = run_ranks(url, r0, w0, b0, None, consume=3)
    assert state["num_replicas"] == r0 and state["num_workers"] == w0
    state = json.loads(json.dumps(state))  # what a checkpoint keeps
    tail, _, counts = run_ranks(url, r1, w1, b1, state, consume=None)
    assert len(set(counts)) == 1  # every new rank the same number of items
    seen = head + tail
    assert len(seen) == len(set(seen))  # nothing read twice across the resume
    epoch_records = SIZES_TOTAL - SIZES_TOTAL % r0  # what the first layout's epoch holds
    assert epoch_records - r1 < len(seen) <= epoch_records  # drop_last: < r1 left out


def test_elastic_resume_twice_in_one_epoch(url: str) -> None:
    head, state, _ = run_ranks(url, 3, 1, None, None, consume=5)
    middle, state, _ = run_ranks(url, 2, 2, 3, state, consume=2)
    assert "elastic" in state and state["elastic"]["num_replicas"] == 3
    tail, _, _ = run_ranks(url, 4, 0, None, state, consume=None)
    seen = head + middle + tail
    assert len(seen) == len(set(seen))
    assert len(seen) > SIZES_TOTAL - 3 - 2 - 4


@pytest.mark.parametrize("after", [2, 4])
def test_elastic_resume_without_drop_last_pads_by_wrapping(url: str, after: int) -> None:
    head, state, _ = run_ranks(url, 3, 0, None, None, consume=4, drop_last=False)
    tail, _, counts = run_ranks(url, after, 0, None, state, consume=None, drop_last=False)
    assert len(set(counts)) == 1
    old_epoch = 3 * math.ceil(SIZES_TOTAL / 3)  # the first layout's epoch, its padding included
    rest = old_epoch - len(head)
    new_padding = -rest % after  # the new ranks pad the rest by wrapping, fewer than `after`
    seen = Counter(head + tail)
    assert set(seen) == set(range(SIZES_TOTAL))  # every record at least once
    assert sum(seen.values()) == old_epoch + new_padding  # repeats: only the padding


def test_bad_states_are_named(url: str) -> None:
    ds = StreamingDataset(url)
    with pytest.raises(ValueError, match=r"state\['position'\] must be an int >= 0, got -1"):
        ds.load_state_dict({"epoch": 0, "position": -1})
    with pytest.raises(ValueError, match=r"state\['epoch'\] must be an int >= 0, got None"):
        ds.load_state_dict({"position": 2})


@pytest.mark.parametrize("batch_size", [None, 6])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_torchdata_stateful_dataloader(
    url: str, batch_size: int | None, workers: int
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> StatefulDataLoader:
        ds = StreamingDataset(url, num_replicas=2, rank=0, seed=8, batch_size=batch_size)
        ds.set_epoch(1)
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    full = [key(x) for x in make()]
    for k in (0, 1, 7, len(full) - 1):
        first = make()
        it = iter(first)
        head = [key(next(it)) for _ in range(k)]
        state = first.state_dict()
        del it
        second = make()
        second.load_state_dict(state)
        assert head + [key(x) for x in second] == full, k


def test_elastic_resume_under_torchrun_3_then_2_ranks(tmp_path: Path) -> None:
    from .conftest import REPO, torchrun

    write_dataset(fsspec.filesystem("file"), str(tmp_path / "d"), "parquet", sizes=[60] * 7)
    script, out = REPO / "tests" / "dist" / "elastic.py", str(tmp_path / "run")
    torchrun(script, "first", str(tmp_path / "d"), out, nproc=3)
    torchrun(script, "second", str(tmp_path / "d"), out, nproc=2)
    first = json.loads(Path(out + ".first").read_text())
    second = json.loads(Path(out + ".second").read_text())
    assert [len(ids) for ids in first] == [15] * 3  # 3 batches of 5 on each of 3 ranks
    assert len(second) == 2 and len(second[0]) == len(second[1])  # equal on the new ranks
    seen = [i for ids in first + second for i in ids]
    assert len(seen) == len(set(seen))  # exactly once across the resize
    assert 420 - 2 < len(seen) <= 420  # drop_last: fewer than 2 records left out


def test_a_resume_does_not_read_what_it_skips(s3: Any) -> None:
    """Resumed at 3/4 of the epoch, a rank fetches about the last quarter of the bytes: the
    plan seeks to its block, and only that block's pieces are read again (the records of a
    block's pieces are shuffled across the whole block)."""
    from tests.s3proxy import counting_proxy

    fs = s3.fs()
    fs.mkdir("resume")
    write_dataset(fs, "resume/d", "parquet", sizes=[2000] * 16, row_group_size=500, payload=100)
    total = sum(fs.size(p) for p in fs.ls("resume/d"))
    index = ShardIndex.build("s3://resume/d", s3.storage_options)
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset(index, storage_options=opts, window=2, batch_size=100)
        ds.load_state_dict(ds.consumed_state(240, num_workers=0))  # 24,000 of 32,000 records
        rest = [i for batch in ds for i in batch["id"].tolist()]
    assert len(rest) == 8000
    fraction = proxy.bytes_served / total
    assert 0.2 < fraction < 0.25 + 2 / 16 + 0.02, fraction  # the rest, plus one block of 2
