"""The S3 fixture is a real endpoint: s3fs talks HTTP to it, and each test starts empty."""

from __future__ import annotations

from typing import Any

import pytest


def test_s3_round_trip(s3) -> None:
    fs = s3.fs()
    fs.mkdir("bucket-a")
    fs.pipe("bucket-a/x/obj.bin", b"hello shards")
    assert fs.cat("bucket-a/x/obj.bin") == b"hello shards"
    assert fs.cat_file("bucket-a/x/obj.bin", start=6, end=12) == b"shards"
    assert s3.endpoint_url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("attempt", [1, 2])
def test_s3_is_reset_between_tests(s3, attempt: int) -> None:
    # both attempts create the same bucket: the second would find it without the reset
    fs = s3.fs()
    assert fs.ls("") == []
    fs.mkdir("bucket-reset")
    fs.pipe("bucket-reset/obj", b"x")
    assert fs.ls("") == ["bucket-reset"]


def test_shaping_proxy_adds_latency_and_caps_the_rate(s3: Any) -> None:
    import time

    from tests.s3proxy import Shaping, counting_proxy

    fs = s3.fs()
    fs.mkdir("shaped")
    fs.pipe("shaped/blob", bytes(2_000_000))
    with counting_proxy(s3.endpoint_url, shaping=Shaping(latency_ms=200, mbps=10)) as proxy:
        import s3fs

        slow = s3fs.S3FileSystem(
            client_kwargs={"endpoint_url": proxy.url}, skip_instance_cache=True
        )
        t0 = time.monotonic()
        assert slow.cat_file("shaped/blob", start=0, end=1_000_000) == bytes(1_000_000)
        took = time.monotonic() - t0
    # the floor the shaping sets (0.2 s + 1 MB at 10 MB/s), not a speed limit of ours
    assert took >= 0.3 and proxy.bytes_served == 1_000_000
