"""S3 faults through a fault-injecting proxy in front of the real (moto) S3 server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from torch.utils.data import DataLoader

from loader import RetryPolicy, ShardError, ShardIndex, StreamingDataset
from scripts.s3proxy import Faults, counting_proxy

from .datagen import record_id, write_dataset

FAST = RetryPolicy(max_attempts=12, base_delay=0.01, max_delay=0.2)


def upload(s3: Any, fmt: str) -> str:
    fs = s3.fs()
    fs.mkdir("faulty")
    write_dataset(fs, f"faulty/{fmt}", fmt, sizes=[300, 0, 410, 170, 350], row_group_size=40)
    return f"s3://faulty/{fmt}"


def read(url: str, options: dict, workers: int, **kw: Any) -> list[int]:
    ds = StreamingDataset(url, num_replicas=2, rank=1, seed=3, storage_options=options, **kw)
    return [record_id(r) for r in DataLoader(ds, batch_size=None, num_workers=workers)]


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_survives_503s_and_resets_unchanged(s3: Any, fmt: str, workers: int) -> None:
    url = upload(s3, fmt)
    clean = read(url, s3.storage_options, workers)
    faults = Faults(slowdown=0.15, reset=0.10, seed=7)
    with counting_proxy(s3.endpoint_url, faults) as proxy:
        opts = {
            "client_kwargs": {"endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"max_attempts": 1}},  # ours alone retry
        }
        faulty = read(url, opts, workers, retry=FAST)
    assert faulty == clean  # the same records, in the same order: none lost, none repeated
    assert proxy.injected["slowdown"] > 0 and proxy.injected["reset"] > 0


def test_every_get_failing_gives_a_clear_error_in_bounded_time(s3: Any) -> None:
    url = upload(s3, "parquet")
    index = ShardIndex.build(url, s3.storage_options)  # built while S3 was healthy
    outcome: list[BaseException] = []
    with counting_proxy(s3.endpoint_url, Faults(every_get=True)) as proxy:
        opts = {
            "client_kwargs": {"endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"max_attempts": 1}},  # botocore's own: none
        }
        policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)

        def run() -> None:
            try:
                list(StreamingDataset(index, storage_options=opts, retry=policy))
            except BaseException as e:
                outcome.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=120)  # a hang fails here rather than holding CI
    assert not thread.is_alive(), "reading with every GET failing did not end"
    (error,) = outcome
    assert isinstance(error, ShardError)
    assert "s3://faulty/parquet/part-0000" in str(error)
    assert "after 3 attempts" in str(error) and "last error" in str(error)
