"""Read amplification is said at run time: one WARNING naming the factor and the fix when
a job's readers share read groups (DESIGN.md: a rank fetches about its share of bytes)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from shardstream.loader import StreamingDataset
from shardstream.loader.read.amplification import job_amplification
from tests import rowdata


def _write(folder: Path, shards: int, rows: int, row_group_size: int) -> str:
    folder.mkdir()
    for k in range(shards):
        table = rowdata.table(np.arange(k * rows, (k + 1) * rows))
        pq.write_table(table, folder / f"part-{k}.parquet", row_group_size=row_group_size)
    return str(folder)


def _warnings(ds: StreamingDataset, caplog: pytest.LogCaptureFixture, epochs: int) -> list[str]:
    """The read-amplification warnings of reading `epochs` epochs of `ds` (each whole)."""
    with caplog.at_level(logging.WARNING, logger="shardstream.loader"):
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            assert len(list(ds)) == len(ds)
    return [r.getMessage() for r in caplog.records if "read amplification" in r.getMessage()]


def test_readers_sharing_one_row_group_are_warned_once_from_rank_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _write(tmp_path / "d", shards=1, rows=800, row_group_size=800)
    said = []
    for rank in range(8):
        ds = StreamingDataset(source, num_replicas=8, rank=rank, columns=["id"])
        assert len(ds) == 100
        caplog.clear()
        said.append(_warnings(ds, caplog, epochs=2))  # once a job, not every epoch
    assert all(s == [] for s in said[1:])  # the job's other ranks stay quiet
    (message,) = said[0]
    assert "read amplification 8.0x" in message and "8 ranks x 1 DataLoader workers" in message
    assert "fewer DataLoader workers" in message and "shardstream-plan" in message


def test_the_worst_worker_of_any_rank_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the case: 3 pandas files (one row group each) and 4 DataLoader workers. Rank
    # 0's worker 0 reads 3/4 of the first file, cheaply enough to pass; the job's
    # worst (worker 1) fetches two whole files for 750 of their rows (checked against the
    # readers' real plans)
    folder = tmp_path / "d"
    folder.mkdir()
    for k in range(3):
        frame = pd.DataFrame({"id": np.arange(k * 1000, (k + 1) * 1000), "x": np.ones(1000)})
        frame.to_parquet(folder / f"part-{k}.parquet")
    ds = StreamingDataset(str(folder), shuffle=False)
    index, workers = ds.index, 4
    # every reader's bytes from its real plan, as the planner computes them
    factors = []
    for _, _, plan in ds.sampler.all_plans(workers):
        pieces = list(zip(plan.shards.tolist(), plan.starts.tolist(), plan.stops.tolist()))
        fetched = sum(index.bytes_for(s, a, b) for s, a, b in pieces)
        share = sum(index.bytes_for(s, 0, 1000) * (b - a) / 1000 for s, a, b in pieces)
        factors.append(fetched / share)
    first = factors[0]  # rank 0's worker 0: all the old check looked at
    worst = job_amplification(index, ds.sampler, workers, 1)
    assert worst is not None and worst[0] == pytest.approx(max(factors))
    assert first < 1.5 < worst[0]
    # the real run: DataLoader workers in a fresh process, what its log says
    script = (
        "import logging, sys; from torch.utils.data import DataLoader; "
        "from shardstream.loader import StreamingDataset; logging.basicConfig(); "
        "ds = StreamingDataset(sys.argv[1], shuffle=False); "
        "loader = DataLoader(ds, batch_size=100, num_workers=4); "
        "print(sum(len(b['id']) for b in loader))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["3000"]
    said = [line for line in run.stderr.splitlines() if "read amplification" in line]
    assert len(said) == 1, run.stderr
    assert f"read amplification {worst[0]:.1f}x" in said[0] and "1 rank x 4" in said[0]


def test_readers_of_their_own_row_groups_are_not_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _write(tmp_path / "d", shards=4, rows=800, row_group_size=50)
    ds = StreamingDataset(source, num_replicas=2, rank=1, columns=["id"])
    assert len(ds) == 1600
    assert _warnings(ds, caplog, epochs=1) == []
