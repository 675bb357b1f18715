"""loader.prefetch.ahead: same items, errors carried over, early stop stops the producer."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from loader.prefetch import ahead


def test_same_items_in_order() -> None:
    assert list(ahead(iter(range(1000)), 3)) == list(range(1000))
    assert list(ahead(iter(range(5)), 0)) == list(range(5))


def test_an_error_in_the_producer_reaches_the_consumer() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("shard s3://b/x.parquet: bad bytes")

    it = ahead(broken(), 2)
    assert next(it) == 1
    with pytest.raises(ValueError, match=r"s3://b/x\.parquet: bad bytes"):
        next(it)


def test_stopping_early_stops_and_closes_the_producer() -> None:
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    it = ahead(endless(), 2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    assert closed.wait(timeout=10)
    assert not any(t.name == "shardstream-ahead" and t.is_alive() for t in threading.enumerate())
