"""Habits that used to end in silently wrong training (issue 50):

- a dataset built before ``init_process_group`` reads as the group's rank once the group
  is up (loader.ranks): under torch.multiprocessing.spawn, torchrun and Lightning's DDP;
- an epoch loop without ``set_epoch`` (Lightning's, ``islice(loader, len(loader))``) is
  warned about, and the README's Lightning callback gives each epoch its own order.

Each run compares whole rows (every column) with what pyarrow.dataset reads."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset
from tests import rowdata

from .conftest import REPO, free_port, torchrun

DIST = REPO / "tests" / "dist"
SIZES = [300, 250, 450]


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rows") / "data"
    rowdata.write_parquet(root, 0, SIZES, row_group_size=50)
    return root


def _expected(root: Path, batch: bool) -> dict[int, dict[str, Any]]:
    want = rowdata.columns_expected(root)
    return {i: rowdata.batch_view(r) if batch else r for i, r in want.items()}


def _each_once(ranks: list[list[dict[str, Any]]], want: dict[int, dict[str, Any]]) -> None:
    """The ranks' rows together are every row exactly once, each equal to pyarrow's."""
    got = [row for rows in ranks for row in rows]
    assert sorted(rowdata.row_id(r) for r in got) == sorted(want)
    for row in got:
        assert rowdata.same(row, want[rowdata.row_id(row)]), row


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _results(out: Path, n: int = 2) -> list[dict[str, Any]]:
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(n)]


# --- a dataset built before the process group --------------------------------------------


@pytest.mark.parametrize(
    ("workers", "context", "batch_size"),
    [(0, "fork", 0), (2, "fork", 50), (2, "spawn", 50)],
)
def test_spawned_ranks_building_the_dataset_first_read_their_share(
    rows: Path, tmp_path: Path, workers: int, context: str, batch_size: int
) -> None:
    # torch.multiprocessing.spawn: no torchrun variables, the group after the dataset
    args = [str(rows), str(tmp_path), str(workers), context, str(batch_size)]
    cmd = [sys.executable, str(DIST / "before_group.py"), "spawn", str(free_port()), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
    assert run.returncode == 0, run.stderr
    results = _results(tmp_path)
    assert [r["replicas"] for r in results] == [2, 2]
    per_rank = sum(SIZES) // 2
    items = -(-per_rank // batch_size) if batch_size else per_rank
    for r in results:
        # len() taken before the group counted for one rank; after it, for the group's
        assert r["before"] == (-(-sum(SIZES) // batch_size) if batch_size else sum(SIZES))
        assert r["len"] == r["items"] == items and len(r["rows"]) == per_rank
    _each_once([r["rows"] for r in results], _expected(rows, bool(batch_size)))
    # the len() taken too early is said, with the fix
    assert run.stderr.count("len(dataset) was") == 2, run.stderr
    assert "init_process_group" in run.stderr


def test_torchrun_ranks_building_the_dataset_first_read_their_share(
    rows: Path, tmp_path: Path
) -> None:
    # torchrun's variables give the rank before the group: the group agrees, nothing moves
    torchrun(DIST / "before_group.py", "torchrun", str(rows), str(tmp_path), "2", "fork", "50")
    results = _results(tmp_path)
    assert [r["before"] for r in results] == [r["len"] for r in results] == [10, 10]
    _each_once([r["rows"] for r in results], _expected(rows, True))


def test_a_rank_that_cannot_be_known_yet_is_an_error_only_where_it_is_needed(
    rows: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning's launcher sets WORLD_SIZE and not RANK until the group starts: building
    # the dataset then is fine; sizing or reading it without a group names the fix
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = StreamingDataset(str(rows), batch_size=50, **_batch_options())
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2 is set but RANK is not.*after "):
        len(ds)
    with pytest.raises(ValueError, match=r"init_process_group"):
        next(iter(ds))
    # explicit ranks are final: no group needed
    assert len(StreamingDataset(str(rows), batch_size=50, num_replicas=2, rank=1)) == 10


def _batch_options() -> dict[str, Any]:
    return {"fill_nulls": {"maybe": rowdata.FILL}, "pad": {"ragged": rowdata.PAD}}


# --- Lightning's DDP on the CPU -----------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "workers", "persistent", "set_epoch"),
    [("init", 0, 0, 0), ("setup", 2, 1, 1), ("before", 2, 0, 1)],
)
def test_lightning_ddp_reads_each_rank_its_share_every_epoch(
    rows: Path, tmp_path: Path, where: str, workers: int, persistent: int, set_epoch: int
) -> None:
    args = [str(rows), str(tmp_path), where, str(workers), str(persistent), str(set_epoch)]
    cmd = [sys.executable, str(DIST / "lightning_job.py"), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    results = _results(tmp_path)
    assert [r["replicas"] for r in results] == [2, 2]
    want = _expected(rows, True)
    for epoch in range(3):
        _each_once([r["epochs"][epoch] for r in results], want)
    orders = [[rowdata.row_id(row) for row in results[0]["epochs"][e]] for e in range(3)]
    warned = run.stderr.count("without set_epoch()")
    if set_epoch:  # the README's callback: a new order each epoch, no warning
        assert orders[0] != orders[1] != orders[2] and warned == 0
    else:  # the same order again, and a warning naming set_epoch (once a rank)
        assert orders[0] == orders[1] == orders[2] and warned == 2


# --- loops without set_epoch -------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [None, 64])
def test_a_loop_of_len_items_without_set_epoch_is_warned(rows: Path, batch_size: Any) -> None:
    # Lightning's loop with num_workers=0 takes len(loader) items and never asks past them
    options = _batch_options() if batch_size else {}
    ds = StreamingDataset(str(rows), batch_size=batch_size, **options)
    loader = DataLoader(ds, batch_size=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = list(itertools.islice(iter(loader), len(loader)))
    with pytest.warns(UserWarning, match=r"without set_epoch\(\).*ds.set_epoch\(epoch\)"):
        second = list(itertools.islice(iter(loader), len(loader)))
    assert [rowdata.row_id(r) for r in _rows(first, batch_size)] == [
        rowdata.row_id(r) for r in _rows(second, batch_size)
    ]


def test_a_pass_stopped_one_item_short_is_not_warned(rows: Path) -> None:
    ds = StreamingDataset(str(rows), batch_size=64, **_batch_options())
    list(itertools.islice(iter(ds), len(ds) - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(ds)) == len(ds)


def _rows(items: list[Any], batch_size: Any) -> list[dict[str, Any]]:
    return [row for item in items for row in rowdata.rows_of(item, batch_size is not None)]
