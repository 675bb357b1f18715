"""ds.stats(): where the loader's time goes, summed over DataLoader workers."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import RetryPolicy, ShardIndex, StreamingDataset
from tests.s3proxy import Faults, counting_proxy

from .datagen import record_id, write_dataset

SIZES = [300, 0, 410, 170, 350]
N = sum(SIZES)


def local(tmp_path: Path) -> str:
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "d"), "parquet", SIZES, 40)
    return str(tmp_path / "d")


def test_a_plain_loop_counts_records_bytes_and_its_own_stall(tmp_path: Path) -> None:
    index = ShardIndex.build(local(tmp_path))
    ds = StreamingDataset(index, batch_size=50)
    for _ in ds:
        time.sleep(0.002)  # the consumer's own work: not stall
    st = ds.stats()
    assert st["records"] == N
    read = [s for s in index.shards if s.num_records]
    assert st["bytes_fetched"] == sum(sum(s.details["row_group_bytes"]) for s in read)
    assert st["requests"] > 0 and st["retries"] == 0
    assert st["decode_s"] > 0 and st["consumer_wall_s"] >= st["consumer_wait_s"] > 0
    assert 0 < st["stall_fraction"] < 1
    assert st["consumer_wall_s"] >= 0.002 * (N // 50)  # the sleeps are in the wall time
    ds.reset_stats()
    assert ds.stats()["records"] == 0 and ds.stats()["stall_fraction"] is None


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_counts_reach_the_main_process(tmp_path: Path, context: str) -> None:
    ds = StreamingDataset(local(tmp_path), seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    ids = [record_id(r) for r in loader]
    assert sorted(ids) == list(range(N))
    st = ds.stats()
    assert st["records"] == N and st["bytes_fetched"] > 0 and st["decode_s"] > 0
    assert st["stall_fraction"] is None  # nobody timed the consumer
    again = [record_id(r) for r in ds.timed(loader)]  # a second epoch, timed
    assert sorted(again) == list(range(N))
    st = ds.stats()
    assert st["records"] == 2 * N
    assert 0 < st["consumer_wait_s"] <= st["consumer_wall_s"] and 0 < st["stall_fraction"] <= 1


def test_s3_requests_retries_and_fetch_time(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("stats")
    write_dataset(fs, "stats/d", "parquet", SIZES, row_group_size=40)
    index = ShardIndex.build("s3://stats/d", s3.storage_options)
    # connections dropped mid-body: ours to retry (s3fs itself retries 503 SlowDown, which
    # it does not report)
    with counting_proxy(s3.endpoint_url, Faults(reset=0.4, seed=3)) as proxy:
        opts = {
            "client_kwargs": {"endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"max_attempts": 1}},  # ours alone retry
        }
        policy = RetryPolicy(max_attempts=20, base_delay=0.001, max_delay=0.01)
        ds = StreamingDataset(index, storage_options=opts, retry=policy, batch_size=64)
        assert sum(len(b["id"]) for b in ds) == N
    st = ds.stats()
    gets = sum(1 for method, *_ in proxy.requests if method == "GET")
    assert st["requests"] == gets + proxy.injected["reset"]  # every try, failed ones too
    assert st["retries"] == proxy.injected["reset"] > 0
    assert st["bytes_fetched"] >= proxy.bytes_served  # and the halves of the dropped ones
    assert st["fetch_s"] > 0 and st["decode_s"] > 0


def test_log_every_logs_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ds = StreamingDataset(local(tmp_path), batch_size=10, log_every=0.01)
    with caplog.at_level(logging.INFO, logger="shardstream.loader.stats"):
        for _ in ds:
            time.sleep(0.002)
    lines = [r.getMessage() for r in caplog.records if r.name == "shardstream.loader.stats"]
    assert lines and all(m.startswith("loader: ") for m in lines)
    assert "records" in lines[-1] and "data stall" in lines[-1] and "\n" not in lines[-1]
    with pytest.raises(ValueError, match=r"log_every must be seconds > 0 or None, got 0"):
        StreamingDataset(local(tmp_path), log_every=0)
