"""A mixture's rows: each stream's rows of a segment taken n at a time, and merged in the
schedule's order into records or one batch (loader.mixture reads the plan with these)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from sampler.mixture_read import segment_parts
from sampler.resume import Segment

from ..columns.placement import Placement
from ..errors import ShardError, redact
from ..formats import Format

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
    format's taken parts (batch mode: columns of numpy or Arrow arrays, or a list of tar
    samples) or as records carrying the stream's name."""

    def __init__(
        self, parts: Iterator[Any], fmt: Format, index: int, name: str, batch: bool
    ) -> None:
        self._parts, self.fmt, self.index, self.name, self._batch = parts, fmt, index, name, batch
        self._head: Any = None
        self._rows = 0  # rows in _head
        self._at = 0  # rows of _head taken

    def start(self) -> None:
        """Read up to the first part (started for every stream at once: see start_all);
        a stream with no rows in the segment has none."""
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
        self._head, self._at = part, 0
        self._rows = len(next(iter(part.values()))) if isinstance(part, dict) else len(part)

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


def _slice(part: Any, at: int, n: int) -> Any:
    """Rows [at, at + n) of a taken part (columns of numpy or Arrow arrays, or a list)."""
    if isinstance(part, list):
        return part[at : at + n]
    return {
        c: v[at : at + n] if isinstance(v, np.ndarray) else v.slice(at, n) for c, v in part.items()
    }


def start_all(streams: list[StreamRows], concurrent: bool) -> None:
    """Start every stream's reads at once: the first part of each is read concurrently
    (`concurrent`: some stream is remote), so no stream's first block waits for another's
    round trips. Local streams start one after the other: their first groups cost CPU,
    not waiting, and threads would only take the GIL from each other."""
    if len(streams) == 1 or not concurrent:
        for s in streams:
            s.start()
        return
    with ThreadPoolExecutor(max_workers=len(streams)) as pool:
        for f in [pool.submit(s.start) for s in streams]:
            f.result()


def merge(ids: np.ndarray, streams: list[StreamRows], batch: bool, pads: Mapping[str, Any]) -> Any:
    """Rows of the streams at the positions `ids` names (stream index per position): a
    list of records, or (batch mode) one batch made by the first stream's format from the
    streams' taken rows laid out in the schedule's order, with "__stream__" (indices).
    `pads`: pad values of plain list columns, whose widths may differ between streams.

    A batch's columns are placed by one `Placement` (loader.columns.placement), the same for
    every column of every kind ("__stream__" included): a row of the batch is one record."""
    at = {s.index: np.flatnonzero(ids == s.index) for s in streams}  # each stream's positions
    pieces = {s.index: s.take(len(at[s.index])) for s in streams}
    if not batch or isinstance(next(p for ps in pieces.values() for p in ps), list):
        rows = {k: iter([r for p in ps for r in p]) for k, ps in pieces.items()}
        merged_rows = [next(rows[k]) for k in ids.tolist()]
        return merged_rows if not batch else streams[0].fmt.batch(merged_rows)
    # a stream's positions take its next rows: its pieces, in order, fill them in turn
    laid, places = [], []
    for k in sorted(pieces):
        lo = 0
        for p in pieces[k]:
            laid.append(p)
            places.append(at[k][lo : lo + _rows(p)])
            lo += len(places[-1])
    place = Placement.of_places(places)
    merged = {col: place.apply(_padded([p[col] for p in laid], pads.get(col))) for col in laid[0]}
    # the stream of position i is ids[i] (its row is that stream's next): no placing needed
    merged[STREAM] = np.array(ids, dtype=np.int64)
    return streams[0].fmt.batch(merged)


def _rows(part: dict[str, Any]) -> int:
    return len(next(iter(part.values())))


def _padded(parts: list[Any], pad: Any) -> list[Any]:
    """2-D numpy parts of a padded column, padded to the widest (streams' widths differ)."""
    if pad is None or not isinstance(parts[0], np.ndarray) or parts[0].ndim != 2:
        return parts
    if len({p.shape[1] for p in parts}) == 1:
        return parts
    width = max(p.shape[1] for p in parts)
    return [np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=pad) for p in parts]


def mixed_parts(
    segments: Sequence[Segment],
    planner_for: Callable[[int, int], Any],
    root: Any,
    readers: Sequence[Any],
    names: Sequence[str],
    shape: tuple[int, bool, Mapping[str, Any]],
    pools: Sequence[ThreadPoolExecutor],
) -> Iterator[Any]:
    """A mixture's segments (rank, worker, a, b of the layout `root` the epoch started in)
    read in order, as parts of at most `step` positions ending at multiples of `step` from
    the start (record mode: lists of records): `shape` is (step, batch mode, pad values).
    `planner_for(num_replicas, rank)`: that rank's MixtureSampler of the epoch; `readers`:
    each stream's PlanReader. The readers' shared `pools` are shut down when this ends."""
    step, batch, pad = shape
    done = 0
    try:
        for left, _, part, ids in segment_parts(segments, planner_for, root):
            streams = [
                StreamRows(
                    reader.parts([(p.plan, p.start, p.stop) for p in part.pieces[k]], step),
                    reader.fmt,
                    k,
                    names[k],
                    batch,
                )
                for k, reader in enumerate(readers)
            ]
            try:
                start_all(streams, concurrent=not all(r.local for r in readers))
                while left > 0:
                    n = min(left, step - done % step)
                    yield merge(ids.take(n), streams, batch, pad)
                    done, left = done + n, left - n
            finally:
                for s in streams:
                    s.close()
    finally:
        for pool in pools:
            pool.shutdown(wait=True)
