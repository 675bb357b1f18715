"""A shard rewritten while a process lives: StaleIndexError in any process, at any epoch;
a fresh index of the new bytes reads the new values; caches are keyed by version."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import ShardIndex, StaleIndexError, StreamingDataset
from tests.s3proxy import counting_proxy


def _write(path: Path | str, values: list[Any], fs: Any = None) -> None:
    table = pa.table({"x": values})
    if fs is None:
        pq.write_table(table, path)
    else:
        with fs.open(path, "wb") as f:
            pq.write_table(table, f)


def _same_size_rewrite(path: Path) -> None:
    """Other bytes of exactly the same size (the same schema and layout, other values)."""
    before = path.stat().st_size
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    _write(path, [7, 8, 9])
    assert path.stat().st_size == before


@pytest.mark.parametrize("workers", [0, 2])
def test_rewritten_between_epochs_in_one_process(tmp_path: Path, workers: int) -> None:
    _write(tmp_path / "a.parquet", [1, 2, 3])
    ds = StreamingDataset(str(tmp_path), shuffle=False)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    assert [r["x"] for r in loader] == [1, 2, 3]  # epoch 0: footer cached, file read
    time.sleep(0.05)
    _write(tmp_path / "a.parquet", ["a", "b", "c"])  # strings now: a new schema
    ds.set_epoch(1)
    with pytest.raises(StaleIndexError, match=r"a.parquet \(indexed \d+ bytes.*rebuild it"):
        list(loader)
    fresh = StreamingDataset(str(tmp_path), shuffle=False)  # the same URL, a new index
    assert [r["x"] for r in fresh] == ["a", "b", "c"]


def test_a_same_size_rewrite_is_caught(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", [1, 2, 3])
    ds = StreamingDataset(str(tmp_path), shuffle=False)
    assert [r["x"] for r in ds] == [1, 2, 3]
    _same_size_rewrite(tmp_path / "a.parquet")
    with pytest.raises(StaleIndexError, match=r"a\.parquet"):
        list(ds)
    assert [r["x"] for r in StreamingDataset(str(tmp_path), shuffle=False)] == [7, 8, 9]


def test_a_rewritten_tar_is_caught(tmp_path: Path) -> None:
    import webdataset as wds

    def write(text: str) -> None:
        with wds.TarWriter(str(tmp_path / "a.tar")) as w:
            for i in range(3):
                w.write({"__key__": f"s{i}", "txt": f"{text}{i}"})

    write("old")
    ds = StreamingDataset(str(tmp_path), shuffle=False)
    assert [r["txt"] for r in ds] == [b"old0", b"old1", b"old2"]
    time.sleep(0.05)
    write("new")  # same size, other bytes
    with pytest.raises(StaleIndexError, match=r"a\.tar"):
        list(ds)


def test_s3_rewrite_is_caught_by_if_match_without_extra_requests(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("stale")
    _write("stale/d/a.parquet", [1, 2, 3], fs)
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset("s3://stale/d/", storage_options=opts, shuffle=False)
        before = len(proxy.requests)
        assert [r["x"] for r in ds] == [1, 2, 3]
        reads = proxy.requests[before:]
        assert reads and all(method == "GET" for method, _, _ in reads)  # no HEAD per shard
        shard_gets = zip(proxy.gets, proxy.get_headers)  # shard reads (not listings, index)
        ranged = [h for (path, _), h in shard_gets if path.endswith(".parquet") and "Range" in h]
        assert ranged and all("If-Match" in h for h in ranged)
        _write("stale/d/a.parquet", [7, 8, 9], s3.fs())  # same size: only the ETag differs
        ds.set_epoch(1)
        with pytest.raises(StaleIndexError, match=r"s3://stale/d/a.parquet: the shard changed"):
            list(ds)
        # a fresh index in the same process: s3fs's listing cache must not hide the change
        fresh = StreamingDataset("s3://stale/d/", storage_options=opts, shuffle=False)
        assert [r["x"] for r in fresh] == [7, 8, 9]


def test_index_verify_names_changed_shards(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", [1, 2, 3])
    index = ShardIndex.build(str(tmp_path))
    index.verify()
    _same_size_rewrite(tmp_path / "a.parquet")
    with pytest.raises(StaleIndexError, match=r"1 shard\(s\) changed.*a.parquet"):
        index.verify()
