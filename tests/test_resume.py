"""Resume mid-epoch (invariant 7): exactly the items not yet yielded, in the same order."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from loader import StreamingDataset
from loader.resume import resume_point

from .datagen import record_id, write_dataset
from .helpers import check_resume


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
        assert state == {"epoch": 2, "position": k, "num_workers": workers}
        fresh = StreamingDataset(url, num_replicas=3, rank=2, seed=1, batch_size=batch_size)
        fresh.load_state_dict(state)
        fresh.set_epoch(2)
        assert [key(x) for x in loader(fresh)] == full[k:], k


def test_resume_with_another_worker_count_is_refused(url: str) -> None:
    ds = StreamingDataset(url)
    ds.load_state_dict({"epoch": 0, "position": 3, "num_workers": 2})
    with pytest.raises(ValueError, match="num_workers=2, this one has num_workers=0"):
        list(ds)


def test_bad_states_are_named(url: str) -> None:
    ds = StreamingDataset(url)
    with pytest.raises(ValueError, match=r"state\['position'\] must be an int >= 0, got -1"):
        ds.load_state_dict({"epoch": 0, "position": -1})
    with pytest.raises(ValueError, match=r"state\['epoch'\] must be an int >= 0, got None"):
        ds.load_state_dict({"position": 2})
