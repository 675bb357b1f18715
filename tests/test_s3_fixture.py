"""The S3 fixture is a real endpoint: s3fs talks HTTP to it, and each test starts empty."""

from __future__ import annotations

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
