"""S3 faults through a fault-injecting proxy in front of the real (moto) S3 server."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardstream.loader import RetryPolicy, ShardError, ShardIndex, StreamingDataset
from tests.s3proxy import Faults, counting_proxy

from .conftest import free_port
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
        # the DEFAULT settings: our RetryPolicy, s3fs and botocore as
        # loader.storage.filesystems sets them
        faulty = read(url, {"client_kwargs": {"endpoint_url": proxy.url}}, workers)
    assert faulty == clean  # the same records, in the same order: none lost, none repeated
    assert proxy.injected["slowdown"] > 0 and proxy.injected["reset"] > 0


def test_an_epoch_survives_faults_with_only_our_retries(s3: Any) -> None:
    url = upload(s3, "parquet")
    clean = read(url, s3.storage_options, 0)
    with counting_proxy(s3.endpoint_url, Faults(slowdown=0.15, reset=0.10, seed=8)) as proxy:
        opts = {
            "client_kwargs": {"endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"total_max_attempts": 1}},  # botocore's own: none
        }
        assert read(url, opts, 0, retry=FAST) == clean
    assert proxy.injected["slowdown"] > 0 and proxy.injected["reset"] > 0


def read_in_thread(fn: Callable[[], Any], timeout: float = 120) -> BaseException:
    """The error fn() raises, from a thread joined with a timeout: a hang fails the test
    (the generous hang guard is the only clock these tests assert on)."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout)
    assert not thread.is_alive(), f"no error after {timeout} s: the read hangs"
    assert outcome, "the read ended without an error"
    return outcome[0]


def test_every_get_failing_gives_a_clear_error_after_the_attempts(s3: Any) -> None:
    url = upload(s3, "parquet")
    index = ShardIndex.build(url, s3.storage_options)  # built while S3 was healthy
    with counting_proxy(s3.endpoint_url, Faults(every_get=True)) as proxy:
        opts = {
            "client_kwargs": {"endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"total_max_attempts": 1}},  # botocore's own: none
        }
        policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
        error = read_in_thread(
            lambda: list(StreamingDataset(index, storage_options=opts, retry=policy))
        )
    assert isinstance(error, ShardError)
    assert "s3://faulty/parquet/part-0000" in str(error)
    assert "after 3 attempts" in str(error) and "last error" in str(error)


def test_a_failed_read_stops_the_reads_queued_behind_it(s3: Any) -> None:
    url = upload(s3, "parquet")
    index = ShardIndex.build(url, s3.storage_options)
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
    with counting_proxy(s3.endpoint_url, Faults(every_get=True)) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        # one reader thread: part-00000 is read first, the next shards (read ahead) queued
        ds = StreamingDataset(
            index, shuffle=False, storage_options=opts, retry=policy, read_threads=1
        )
        error = read_in_thread(lambda: list(ds))
    assert "part-00000.parquet" in str(error)
    # the queued read started nothing: it would have spent its own retries first
    assert {path.rsplit("/", 1)[-1] for _, path in proxy.faulted} == {"part-00000.parquet"}


# a dead endpoint with the default settings, on every store:
# test_store_contract.test_a_dead_endpoint_is_a_named_error_with_default_settings


def test_a_dead_endpoint_fails_indexing_with_a_named_error(s3: Any) -> None:
    opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    error = read_in_thread(lambda: ShardIndex.build("s3://faulty/parquet", opts))
    assert isinstance(error, ShardError), repr(error)
    assert "s3://faulty/parquet" in str(error) and "Could not connect" in str(error)


def test_the_retry_deadline_ends_a_read_and_says_so(s3: Any) -> None:
    url = upload(s3, "parquet")
    index = ShardIndex.build(url, s3.storage_options)
    # attempts enough to outlast the deadline many times over: the deadline must end it
    policy = RetryPolicy(max_attempts=10_000, base_delay=0.01, max_delay=0.05, deadline=1.0)
    with counting_proxy(s3.endpoint_url, Faults(every_get=True)) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        error = read_in_thread(
            lambda: list(StreamingDataset(index, storage_options=opts, retry=policy))
        )
    assert isinstance(error, ShardError), repr(error)
    assert re.search(
        r"s3://faulty/parquet/part-0000\d\.parquet: bytes \[\d+, \d+\): retry deadline of 1 s "
        r"reached \(\d+ attempts, .* since the first failure",
        str(error),
    ), str(error)
    assert "last error: " in str(error) and "reduce your request rate" in str(error)


def test_the_retry_deadline_ends_an_index_operation(s3: Any) -> None:
    opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    policy = RetryPolicy(max_attempts=10_000, base_delay=0.01, max_delay=0.05, deadline=1.0)
    error = read_in_thread(lambda: ShardIndex.build("s3://faulty/parquet", opts, retry=policy))
    assert isinstance(error, ShardError), repr(error)
    assert str(error).startswith("s3://faulty/parquet: retry deadline of 1 s reached")
    assert "Could not connect" in str(error)


@pytest.mark.parametrize(
    "kwargs",
    [{"deadline": 0}, {"deadline": -1.0}, {"deadline": math.inf}, {"max_attempts": 0}],
)
def test_bad_retry_policies_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="invalid retry policy"):
        RetryPolicy(**kwargs)
