"""Storage options for S3, GCS and Azure: one retry budget (ours), unless the user
configures the layers below it; checked on the real s3fs, gcsfs and adlfs filesystems and
the clients they produce."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import s3fs

from shardstream.loader.storage.filesystems import filesystem


def client_config(fs: Any) -> Any:
    fs.connect()
    return fs.s3.meta.config  # botocore's Config of the client s3fs made


def test_s3fs_and_botocore_retry_once_by_default(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    fs, path = filesystem("s3://bucket/key.parquet", s3.storage_options)
    assert path == "bucket/key.parquet"
    assert fs.retries == 1  # s3fs tries each call once (its class default: 5, nested)
    config = client_config(fs)
    assert config.retries["total_max_attempts"] == 2  # the request and one retry
    assert (config.connect_timeout, config.read_timeout) == (5.0, 10.0)
    assert pickle.loads(pickle.dumps(fs)).retries == 1  # DataLoader workers get the same


def test_the_users_retry_and_timeout_settings_win(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    options = {
        **s3.storage_options,
        "retries": 4,
        "config_kwargs": {
            "retries": {"max_attempts": 6, "mode": "standard"},
            "connect_timeout": 2,
            "read_timeout": 30,
        },
    }
    fs, _ = filesystem("s3://bucket/key.parquet", options)
    assert fs.retries == 4
    config = client_config(fs)
    assert config.retries == {"mode": "standard", "total_max_attempts": 7}  # 6 retries
    assert (config.connect_timeout, config.read_timeout) == (2, 30)
    assert options["config_kwargs"]["retries"] == {"max_attempts": 6, "mode": "standard"}


def test_aws_max_attempts_in_the_environment_is_left_to_botocore(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    fs, _ = filesystem("s3://bucket/key.parquet", s3.storage_options)
    assert client_config(fs).retries["total_max_attempts"] == 4


def test_a_bad_s3fs_retries_option_is_named(s3: Any) -> None:
    with pytest.raises(ValueError, match=r"storage_options\['retries'\] must be an int >= 1"):
        filesystem("s3://bucket/key.parquet", {**s3.storage_options, "retries": 0})


def test_clearing_s3fs_instance_cache_clears_ours(s3: Any) -> None:
    fs, _ = filesystem("s3://bucket/key.parquet", s3.storage_options)
    assert filesystem("s3://bucket/other.parquet", s3.storage_options)[0] is fs  # cached
    s3fs.S3FileSystem.clear_instance_cache()  # what code that knows only s3fs calls
    assert filesystem("s3://bucket/key.parquet", s3.storage_options)[0] is not fs


def test_gcsfs_tries_once_with_bounded_timeouts_and_without_the_grpc_lookup() -> None:
    import gcsfs.core

    options = {"token": "anon", "endpoint_url": "http://127.0.0.1:9", "project": "p"}
    fs, path = filesystem("gs://bucket/key.parquet", options)
    assert path == "bucket/key.parquet"
    assert type(fs).__mro__[1] is gcsfs.core.GCSFileSystem  # the core one, not "extended"
    timeout = fs.requests_timeout
    assert (timeout.sock_connect, timeout.sock_read) == (5.0, 10.0)
    mine, _ = filesystem("gs://bucket/key.parquet", {**options, "requests_timeout": 60})
    assert mine.requests_timeout == 60  # the user's setting wins
    blob = pickle.dumps(fs)
    type(fs).clear_instance_cache()  # as in a spawned DataLoader worker: built anew
    again = pickle.loads(blob)
    assert again is not fs and type(again) is type(fs)
    assert again.requests_timeout.sock_read == 10.0


def test_the_azure_client_retries_once_with_bounded_timeouts() -> None:
    from tests.emulators import azurite_connection_string

    options = {"connection_string": azurite_connection_string("http://127.0.0.1:9")}
    for given, want in (({}, (5.0, 10.0)), ({"read_timeout": 30}, (5.0, 30))):
        fs, path = filesystem("az://container/key.parquet", {**options, **given})
        assert path == "container/key.parquet"
        client = fs.service_client
        retry = client._config.retry_policy
        assert (retry.total_retries, retry.initial_backoff) == (1, 0.2)  # the SDK's: 3, 15 s
        config = client._pipeline._transport.connection_config
        assert (config.timeout, config.read_timeout) == want
        blob = pickle.dumps(fs)
        type(fs).clear_instance_cache()  # as in a spawned DataLoader worker: built anew
        again = pickle.loads(blob)
        assert again is not fs and type(again) is type(fs)
        assert again.service_client._config.retry_policy.total_retries == 1
        worker_config = again.service_client._pipeline._transport.connection_config
        assert (worker_config.timeout, worker_config.read_timeout) == want


def test_a_gcs_index_saved_with_etags_still_reads_and_refuses_a_rewrite(gcs_endpoint: str) -> None:
    """Indexes saved before generations were kept hold each object's ETag: their reads
    check it (one metadata request a file) instead of reading whatever is there."""
    from shardstream.loader import StaleIndexError
    from shardstream.loader.storage.filesystems import cat_ranges
    from tests.stores import new_bucket

    store = new_bucket("gcs", gcs_endpoint)
    store.fs().pipe(store.path("a.bin"), b"0123456789" * 10)
    fs, _ = filesystem(store.url("a.bin"), store.options())
    info = store.fs().info(store.path("a.bin"))
    assert info["etag"] != info["generation"]
    old = [(100, str(info["etag"]))]
    assert cat_ranges(fs, [store.url("a.bin")], [10], [20], old) == [b"0123456789"]
    store.fs().pipe(store.path("a.bin"), b"abcdefghij" * 10)
    (got,) = cat_ranges(fs, [store.url("a.bin")], [10], [20], old)
    assert isinstance(got, StaleIndexError) and "a.bin" in str(got)
