"""A mixture's rows: each stream's rows of a segment taken n at a time, and merged in the
schedule's order into records or batches (loader.mixture reads the plan with these)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from shardstream.sampler.mixture.read import segment_parts
from shardstream.sampler.resume import Segment

from ..columns.gather import Selection
from ..errors import ShardError, redact
from ..formats import Format
from ..formats.parquet.format import ParquetFormat

__all__ = ["STREAM", "StreamRows", "merge", "mixed_parts", "start_all"]

STREAM = "__stream__"  # records: the stream's name; batches: int64 stream indices


def _holds_stream(sample: dict[str, Any], name: str) -> ShardError:
    return ShardError(
        f"{redact(str(sample.get('__url__', name)))}: sample {sample.get('__key__')!r} of "
        f"stream {name!r} has a member with extension {STREAM!r}, the name a mixture gives "
        "the stream each row came from; rename it"
    )


class StreamRows:
    """One stream's rows of a segment, in its reading order, taken n at a time: as the
    format's parts (batch mode: Selections of Parquet or Arrow rows, or lists of tar
    samples) or as records carrying the stream's name."""

    def __init__(
        self, parts: Iterator[Any], fmt: Format, index: int, name: str, batch: bool
    ) -> None:
        self._parts, self.fmt, self.index, self.name, self._batch = parts, fmt, index, name, batch
        self._opening = True  # `parts` yields OPENED first (PlanReader.parts(opened=True))
        self._head: Any = None
        self._rows = 0  # rows in _head
        self._at = 0  # rows of _head taken

    def open(self) -> None:
        """Start the first groups' reads, waiting for none of them."""
        if self._opening:
            self._opening = False
            next(self._parts, None)  # OPENED, or nothing: no rows

    def start(self) -> None:
        """Read up to the first part (started for every stream at once: see start_all);
        a stream with no rows in the segment has none."""
        self.open()
        if self._head is None:
            with contextlib.suppress(StopIteration):
                self._next()

    def _next(self) -> None:
        part = next(self._parts, None)
        if part is None:
            raise StopIteration
        if not self._batch:
            part = list(self.fmt.records(part))
            for record in part:
                if STREAM in record:
                    raise _holds_stream(record, self.name)
                record[STREAM] = self.name
        elif isinstance(part, list):  # tar samples: batched with the others, by index
            for sample in part:
                if STREAM in sample:
                    raise _holds_stream(sample, self.name)
                sample[STREAM] = self.index
        self._head, self._at, self._rows = part, 0, len(part)

    def take(self, n: int) -> list[Any]:
        """The next n rows as pieces (slices of parts), in order."""
        out = []
        while n > 0:
            if self._head is None or self._at == self._rows:
                try:
                    self._next()
                except StopIteration:
                    raise RuntimeError(
                        f"stream {self.name!r} ran out of records before its planned count"
                    ) from None
            m = min(n, self._rows - self._at)
            out.append(_slice(self._head, self._at, m))
            self._at += m
            n -= m
        return out

    def close(self) -> None:
        close = getattr(self._parts, "close", None)
        if close is not None:
            close()


def _slice(part: list[Any] | Selection, at: int, n: int) -> Any:
    """Rows [at, at + n) of a taken part: a list (records, tar samples) or a Selection."""
    return part[at : at + n] if isinstance(part, list) else part.slice(at, n)


def start_all(streams: list[StreamRows], concurrent: bool) -> None:
    """Start every stream's reads at once: the first part of each is read concurrently
    (`concurrent`: some stream is remote), so no stream's first block waits for another's
    round trips. Local streams start one after the other: their first groups cost CPU,
    not waiting, and threads would only take the GIL from each other; but every stream's
    first reads are started before the first is waited for, so the reading thread reads
    them all beside the consumer (scripts.bench's mixture: first batch 44-50 -> 34 ms)."""
    if len(streams) == 1 or not concurrent:
        for s in streams:
            s.open()
        for s in streams:
            s.start()
        return
    with ThreadPoolExecutor(max_workers=len(streams)) as pool:
        for f in [pool.submit(s.start) for s in streams]:
            f.result()


def merge(ids: np.ndarray, streams: list[StreamRows], batch: int) -> list[Any]:
    """Rows of the streams at the positions `ids` names (stream index per position): one
    list of records, or (batch mode, `batch` rows a batch) batches made by the first
    stream's format, each with "__stream__" (indices) and its plain list columns padded
    to its own longest row. Parquet and Arrow streams' rows come as Selections, taken from
    their blocks at once by one `Placement` (loader.columns.placement), the same for every
    column of every kind: a row of a batch is one record; tar samples are batched in the
    schedule's order."""
    at = {s.index: np.flatnonzero(ids == s.index) for s in streams}  # each stream's positions
    pieces = {s.index: s.take(len(at[s.index])) for s in streams}
    fmt = streams[0].fmt
    cuts = [(a, min(len(ids), a + batch)) for a in range(0, len(ids), batch or max(1, len(ids)))]
    if batch and isinstance(next(p for ps in pieces.values() for p in ps), Selection):
        taken = _gathered(len(ids), at, pieces, fmt)
        return [fmt.batch({**fmt.cut(taken, a, b), STREAM: ids[a:b].copy()}) for a, b in cuts]
    rows = {k: iter([r for p in ps for r in p]) for k, ps in pieces.items()}
    merged = [next(rows[k]) for k in ids.tolist()]
    return [fmt.batch(merged[a:b]) for a, b in cuts] if batch else [merged]


def _gathered(
    n: int, at: dict[int, np.ndarray], pieces: dict[int, list[Any]], fmt: Format
) -> dict[str, Any]:
    """The n rows of the streams' Selections at their positions `at`, taken from their
    blocks at once by one Placement (`fmt.gather`; padding is left to `fmt.cut`)."""
    blocks: list[Any] = []
    number: dict[int, int] = {}  # id(block) -> its place in `blocks` (Selections share them)
    which = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    for k in sorted(pieces):
        lo = 0
        for p in pieces[k]:
            for b in p.blocks:
                if id(b) not in number:
                    number[id(b)] = len(blocks)
                    blocks.append(b)
            places = at[k][lo : lo + len(p)]
            which[places] = np.array([number[id(b)] for b in p.blocks], dtype=np.int64)[p.which]
            rows[places] = p.rows
            lo += len(p)
    taken: dict[str, Any] = fmt.gather(blocks, which, rows)
    return taken


def mixed_parts(
    segments: Sequence[Segment],
    planner_for: Callable[[int, int], Any],
    root: Any,
    readers: Sequence[Any],
    names: Sequence[str],
    shape: tuple[int, int],
    pools: Sequence[ThreadPoolExecutor],
) -> Iterator[Any]:
    """A mixture's segments (rank, worker, a, b of the layout `root` the epoch started in)
    read in order, as parts of at most `step` positions ending at multiples of `step` from
    the start, each as batches (batch mode) or one list of records: `shape` is (step,
    rows a batch; 0: record mode). In batch mode the pass's first part is one batch, and
    each stream's first part that batch's most (`PlanReader.parts(first=)`): the first
    batch waits for the groups it needs, which the streams' openings send, not for a
    step's worth of each stream (the cloud bench's 2 streams: 2-3 round trips in line
    before it, 3-4 before this).
    `planner_for(num_replicas, rank)`: that rank's MixtureSampler of the epoch; `readers`:
    each stream's PlanReader. The readers' shared `pools` are shut down when this ends."""
    step, batch = shape
    done = 0
    try:
        concurrent = not all(r.local for r in readers)
        for left, _, part, ids in segment_parts(segments, planner_for, root):
            lead = batch if done == 0 else 0  # (see the docstring)
            streams = [
                StreamRows(
                    reader.parts(
                        [(p.plan, p.start, p.stop) for p in part.pieces[k]],
                        step,
                        batch > 0 and isinstance(reader.fmt, ParquetFormat),  # Selections
                        opened=True,
                        first=lead,
                    ),
                    reader.fmt,
                    k,
                    names[k],
                    batch > 0,
                )
                for k, reader in enumerate(readers)
            ]
            try:
                start_all(streams, concurrent)
                while left > 0:
                    n = min(left, lead or step - done % step)
                    lead = 0
                    yield from merge(ids.take(n), streams, batch)
                    done, left = done + n, left - n
            finally:
                for s in streams:
                    s.close()
    finally:
        for pool in pools:
            pool.shutdown(wait=True)
