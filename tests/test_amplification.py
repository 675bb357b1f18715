"""Read amplification is said at run time: one WARNING naming the factor and the fix when
a job's readers share read groups (DESIGN.md: a rank fetches about its share of bytes)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from loader import StreamingDataset
from tests import rowdata


def _write(folder: Path, shards: int, rows: int, row_group_size: int) -> str:
    folder.mkdir()
    for k in range(shards):
        table = rowdata.table(np.arange(k * rows, (k + 1) * rows))
        pq.write_table(table, folder / f"part-{k}.parquet", row_group_size=row_group_size)
    return str(folder)


def _warnings(ds: StreamingDataset, caplog: pytest.LogCaptureFixture, epochs: int) -> list[str]:
    """The read-amplification warnings of reading `epochs` epochs of `ds` (each whole)."""
    with caplog.at_level(logging.WARNING, logger="loader"):
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            assert len(list(ds)) == len(ds)
    return [r.getMessage() for r in caplog.records if "read amplification" in r.getMessage()]


def test_readers_sharing_one_row_group_are_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _write(tmp_path / "d", shards=1, rows=800, row_group_size=800)
    ds = StreamingDataset(source, num_replicas=8, rank=3, columns=["id"])
    assert len(ds) == 100
    (message,) = _warnings(ds, caplog, epochs=2)  # once, not every epoch
    assert "read amplification 8.0x" in message and "8 ranks x 1 DataLoader workers" in message
    assert "fewer DataLoader workers" in message and "shardstream-plan" in message


def test_readers_of_their_own_row_groups_are_not_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _write(tmp_path / "d", shards=4, rows=800, row_group_size=50)
    ds = StreamingDataset(source, num_replicas=2, rank=1, columns=["id"])
    assert len(ds) == 1600
    assert _warnings(ds, caplog, epochs=1) == []
