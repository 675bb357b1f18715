"""The read pipeline: records [start, stop) of reading plans, fetched and decoded ahead.

A `PlanReader` knows one dataset (its index, format, columns, storage and retry policy) and
turns runs of a plan into *parts*: what the format's `take` gives for consecutive records
(an Arrow-backed column dict, a list of samples), cut so that every `step` records from
the start of a read end a part (a batch is then one part, or a few joined by `regroup`).

    (plan, start, stop) runs -> blocks of pieces (fetched, decoded and joined in threads)
                             -> parts of at most `step` records, in the plan's order

The dataset adapters (one source or a mixture of streams) decide which runs to read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from sampler.plan import Plan

from .formats import Format
from .index import ShardIndex
from .retry import RetryPolicy
from .storage import filesystem

__all__ = ["PlanReader", "Run"]

Run = tuple[Plan, int, int]  # records [start, stop) of a plan, in its reading order


class _Stopped(Exception):
    """A queued read not started: an earlier read failed (its error is the one raised,
    since reads start in submission order and results are taken in that order)."""


class PlanReader:
    """Reads runs of plans over one ShardIndex.

    A block of `window` pieces (shard row ranges) is read and decoded by `read_threads`
    threads and joined there (see the format's `join`); the next `prefetch` blocks are
    read while one is consumed, so memory holds about (1 + prefetch) decoded blocks.
    """

    def __init__(
        self,
        index: ShardIndex,
        fmt: Format,
        *,
        columns: Sequence[str] | None,
        storage_options: dict[str, Any] | None,
        retry: RetryPolicy,
        read_threads: int,
        prefetch: int,
    ) -> None:
        self.index = index
        self.fmt = fmt
        self.columns = None if columns is None else list(columns)
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.read_threads = read_threads
        self.prefetch = prefetch

    def parts(self, runs: Iterable[Run], step: int) -> Iterator[Any]:
        """The runs' records in reading order, in parts of at most `step` records that end
        at multiples of `step` records from the start (so batches are single parts)."""
        runs = list(runs)
        if not runs or not self.index.shards:
            return
        fs, _ = filesystem(self.index.shards[0].url, self.storage_options)
        done = 0
        # set when a read fails or the consumer stops: reads still queued then start
        # nothing, so the error arrives after the reads in flight, not after every
        # prefetched one has spent its own retries (the pool's exit waits for them)
        halt = threading.Event()
        with ThreadPoolExecutor(max_workers=self.read_threads) as pool:
            try:
                for plan, a, b in runs:
                    yield from self._read_plan(plan, a, b, fs, pool, step, done, halt)
                    done += b - a
            finally:
                halt.set()  # before the pool's exit waits for what it still holds

    def _read_plan(
        self,
        plan: Plan,
        start: int,
        stop: int,
        fs: Any,
        pool: ThreadPoolExecutor,
        step: int,
        done: int,
        halt: threading.Event,
    ) -> Iterator[Any]:
        """Records [start, stop) of the plan, in parts as `parts` says (`done` records came
        before). While a block is consumed, the next `prefetch` blocks are already being
        read by the pool's threads."""
        fmt = self.fmt

        def read(piece: int) -> Any:
            if halt.is_set():
                raise _Stopped("an earlier read failed, or reading stopped")
            shard = self.index.shards[int(plan.shards[piece])]
            first, end = int(plan.starts[piece]), int(plan.stops[piece])
            try:
                return fmt.read(fs, shard, first, end, self.columns)
            except BaseException:
                halt.set()
                raise

        def join(parts: list[Future[Any]]) -> Any:
            # queued after its parts' reads, so those have started when this runs: no
            # deadlock however few threads the pool has
            return fmt.join([f.result() for f in parts])

        blocks = plan.blocks()
        pending: dict[tuple[int, int], tuple[list[Future[Any]], Future[Any]]] = {}

        def submit_from(i: int) -> None:
            """Read and join blocks i .. i + prefetch in the pool, those not yet asked for:
            a block reaches this (consuming) thread ready to gather batches from."""
            for blk in blocks[i : i + 1 + self.prefetch]:
                if blk not in pending:
                    parts = [pool.submit(read, p) for p in range(*blk)]
                    pending[blk] = (parts, pool.submit(join, parts))

        joined: Any = None
        block: tuple[int, int] | None = None
        if start < stop:  # reads start before the first chunk's order is computed
            submit_from(plan.block_at(start))
        try:
            for chunk in plan.chunks(start, stop):
                if chunk.block != block:
                    if joined is not None:
                        fmt.release(joined)
                        joined = None
                    block = chunk.block
                    submit_from(blocks.index(block))
                    joined = pending.pop(block)[1].result()
                    # (k+1,) where each piece of the block starts in `joined`
                    offsets = np.concatenate(([0], np.cumsum(plan.sizes[block[0] : block[1]])))
                local = offsets[chunk.pieces - block[0]] + chunk.rows - plan.starts[chunk.pieces]
                lo = 0
                while lo < local.size:
                    hi = min(local.size, lo + step - done % step)
                    yield fmt.take(joined, local[lo:hi])
                    done += hi - lo
                    lo = hi
        finally:
            if joined is not None:
                fmt.release(joined)
            for parts, joining in pending.values():  # stopped early: drop the prefetched
                for f in [joining, *parts]:
                    f.cancel()
