"""Run a generator in a background thread, a bounded number of items ahead."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["ahead"]

T = TypeVar("T")
_DONE = object()


def ahead(items: Iterator[T], depth: int) -> Iterator[T]:
    """The items of `items`, produced by a daemon thread up to `depth` ahead of the consumer.

    Gathering and decoding (Arrow and numpy release the GIL) then overlap with what the
    consumer does with each item. An exception in the producer is raised in the consumer;
    a consumer that stops early stops the producer.
    """
    if depth < 1:
        yield from items
        return
    out: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="shardstream-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=30)
