"""A StatefulDataLoader state resumes exactly, in its own layout or another, or is refused.

Each rank of a job is a dataset with its own `rank` inside a torchdata StatefulDataLoader
with real worker processes; the job stops after a few batches and every rank keeps
`loader.state_dict()`. The next job has other ranks or workers: each rank gives a saved
state (its own, or rank 0's when the job grew) to `ds.load_state_dict` and reads the rest of
the epoch. Across both jobs no record is read twice, every row is one whole record, at most
the drop_last tail is left out, and the new ranks read equal counts. A worker's own state
loaded by `loader.load_state_dict` into another layout is a ValueError naming both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.loader import Stream, StreamingDataset
from tests import rowdata

B = 4  # records a batch
STOP = 3  # batches each rank reads before the job stops
SIZES = [[37, 0, 52, 11], [23, 40]]
EPOCH = 120  # a mixture's epoch: fewer records of each stream than its pass holds

Make = Callable[[int, int], StreamingDataset]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("layout")
    expected: dict[int, dict[str, Any]] = {}
    for s, sizes in enumerate(SIZES):
        rowdata.write_parquet(root / f"s{s}", s, sizes, row_group_size=8)
        expected |= rowdata.columns_expected(root / f"s{s}")
    return {"root": root, "expected": expected}


def maker(data: dict[str, Any], mixture: bool) -> Make:
    root: Path = data["root"]
    args: dict[str, Any] = {
        "batch_size": B,
        "drop_last": True,
        "seed": 3,
        "columns": ["id", "id_str"],
    }

    def make(replicas: int, rank: int) -> StreamingDataset:
        if not mixture:
            return StreamingDataset(str(root / "s0"), num_replicas=replicas, rank=rank, **args)
        streams = [Stream(str(root / "s0"), weight=0.6), Stream(str(root / "s1"), weight=0.4)]
        return StreamingDataset(streams, epoch_size=EPOCH, num_replicas=replicas, rank=rank, **args)

    return make


def ids(data: dict[str, Any], batches: list[Any]) -> list[int]:
    """The batches' row ids, each row checked to be one whole record."""
    out = []
    for batch in batches:
        for row in rowdata.rows_of(batch, True):
            row.pop("__stream__", None)
            want = data["expected"][rowdata.row_id(row)]
            assert row == {c: want[c] for c in row}, row
            out.append(row["id"])
    return out


def first_job(make: Make, replicas: int, workers: int) -> tuple[list[Any], list[list[Any]]]:
    """(each rank's loader state after STOP batches, each rank's batches)."""
    states, read = [], []
    for rank in range(replicas):
        loader = StatefulDataLoader(make(replicas, rank), batch_size=None, num_workers=workers)
        it = iter(loader)
        read.append([next(it) for _ in range(STOP)])
        states.append(loader.state_dict())
        del it
    return states, read


def second_job(make: Make, replicas: int, workers: int, states: list[Any]) -> list[list[Any]]:
    out = []
    for rank in range(replicas):
        ds = make(replicas, rank)
        ds.load_state_dict(states[rank] if rank < len(states) else states[0])
        out.append(list(StatefulDataLoader(ds, batch_size=None, num_workers=workers)))
    return out


@pytest.mark.parametrize("mixture", [False, True], ids=["one source", "mixture"])
@pytest.mark.parametrize(
    ("old", "new"),
    [((2, 2), (4, 2)), ((4, 2), (2, 2)), ((2, 2), (3, 2)), ((2, 2), (2, 3)), ((2, 0), (3, 1))],
    ids=lambda layout: f"{layout[0]}x{layout[1]}",
)
def test_a_loader_state_resumes_in_another_layout(
    data: dict[str, Any], mixture: bool, old: tuple[int, int], new: tuple[int, int]
) -> None:
    make = maker(data, mixture)
    states, before = first_job(make, *old)
    after = second_job(make, *new, states)
    seen_before = [i for rank in before for i in ids(data, rank)]
    seen_after = [ids(data, rank) for rank in after]
    assert len({len(rank) for rank in seen_after}) == 1, "new ranks read unequal counts"
    seen = seen_before + [i for rank in seen_after for i in rank]
    assert len(seen) == len(set(seen)), "a record was read twice across the resize"
    total = EPOCH if mixture else sum(SIZES[0])
    # drop_last leaves out fewer than R records at each cut: the first job's, the second's
    assert total - old[0] - new[0] < len(seen) <= total


@pytest.mark.parametrize("mixture", [False, True], ids=["one source", "mixture"])
def test_a_loader_state_in_its_own_layout_resumes_the_same_order(
    data: dict[str, Any], mixture: bool
) -> None:
    make = maker(data, mixture)
    full = [ids(data, list(StatefulDataLoader(make(2, r), batch_size=None, num_workers=2)))
            for r in range(2)]  # fmt: skip
    states, before = first_job(make, 2, 2)
    for route in ("dataset", "loader"):
        for rank in range(2):
            ds = make(2, rank)
            loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
            if route == "dataset":
                ds.load_state_dict(states[rank])
            else:
                loader.load_state_dict(states[rank])
            assert ids(data, before[rank]) + ids(data, list(loader)) == full[rank], route


def test_a_worker_state_in_another_layout_is_refused(data: dict[str, Any]) -> None:
    make = maker(data, False)
    states, _ = first_job(make, 2, 2)
    grown = StatefulDataLoader(make(4, 0), batch_size=None, num_workers=2)
    grown.load_state_dict(states[0])
    with pytest.raises(ValueError, match=r"saved by rank 0 of 2 ranks.*loaded into rank 0 of 4"):
        list(grown)
    other_rank = StatefulDataLoader(make(2, 0), batch_size=None, num_workers=2)
    other_rank.load_state_dict(states[1])  # every rank wrote one file: rank 1's won
    with pytest.raises(ValueError, match=r"saved by rank 1 of 2 ranks.*ds.load_state_dict"):
        list(other_rank)


def test_a_state_of_another_dataset_size_is_refused(data: dict[str, Any]) -> None:
    state = maker(data, False)(2, 0).consumed_state(3, 2)
    other = StreamingDataset(str(data["root"] / "s1"), batch_size=B, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"saved for an epoch of 100 records.*has 63"):
        other.load_state_dict(state)
