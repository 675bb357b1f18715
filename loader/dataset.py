"""StreamingDataset: the IterableDataset that reads only this rank's and worker's records."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from sampler import DEFAULT_WINDOW, ShardSampler, Topology
from sampler.plan import Plan

from .formats import Format, format_for
from .index import ShardIndex, check_unchanged
from .resume import resume_point
from .retry import RetryPolicy
from .storage import filesystem, redact

__all__ = ["StreamingDataset"]

log = logging.getLogger(__name__)


def _check_positive(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return value


def _shared_index(
    source: Any, storage_options: dict[str, Any] | None, retry: RetryPolicy
) -> ShardIndex:
    """Build (or load) the index once: on rank 0 when a process group is initialized,
    broadcast to the others, so R ranks do not each list the bucket and read every footer.
    A failure on rank 0 is broadcast too, so no rank waits forever."""
    if isinstance(source, ShardIndex):
        return source
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ShardIndex.resolve(source, storage_options, retry=retry)
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            index = ShardIndex.resolve(source, storage_options, retry=retry)
            box[0] = index.to_json(keep_credentials=True)
        except Exception as e:  # sent to every rank, re-raised everywhere
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return ShardIndex.from_json(box[0])


class StreamingDataset(IterableDataset[Any]):
    """Streams the records a ShardSampler assigns to this rank, from local or S3 shards.

    `source`: a directory, s3:// prefix, glob, list of URLs, a saved index (``*.json``) or a
    ShardIndex. Rank and world size default as the sampler's. Each epoch (`set_epoch`) the
    rank's records are those of ``ShardSampler(...).plan()``: inside a DataLoader with
    `num_workers` W, worker w reads the w-th contiguous part of them, opening its own
    filesystem; none is lost or read twice.

    Records: Parquet rows as ``{column: value}``; tar samples as webdataset's dicts
    (``__key__``, ``__url__``, one bytes entry per extension; `decode` may be True for
    webdataset's basic decoders or a callable on the sample). With `batch_size` B it yields
    batches instead (use ``DataLoader(ds, batch_size=None)``): numeric and fixed-length
    list columns as tensors, others as lists; only the rank's last batch may be short.
    `columns` selects Parquet columns or tar extensions.

    Transient storage errors (throttling, 5xx, dropped connections, timeouts) are retried as
    `retry` says (a RetryPolicy: attempts and backoff); then the error names the shard.

    `set_epoch` reaches workers started earlier (``persistent_workers=True``): the epoch
    lives in a shared-memory tensor.
    """

    def __init__(
        self,
        source: str | Sequence[str] | ShardIndex,
        *,
        columns: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        batch_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
        window: int = DEFAULT_WINDOW,
        decode: bool | Callable[[dict[str, Any]], dict[str, Any]] = False,
        read_threads: int = 8,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = _check_positive("batch_size", batch_size)
        self.read_threads = _check_positive("read_threads", read_threads) or 1
        topo = Topology.resolve(num_replicas, rank)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.index = _shared_index(source, self.storage_options, self.retry)
        self.columns = None if columns is None else list(columns)
        self._check_columns()
        self.sampler = ShardSampler(
            self.index, topo.world_size, topo.rank, shuffle, seed, drop_last, window
        )
        self.decode = decode
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._position = 0  # items yielded in this epoch by this object, in this process
        self._resume: dict[str, int] | None = None

    def _check_columns(self) -> None:
        schema = self.index.schema
        if self.columns is None or schema is None:
            return
        missing = [c for c in self.columns if c not in schema.names]
        if missing:
            where = redact(self.index.shards[0].url)
            raise ValueError(
                f"columns {missing} are not in the shards (e.g. {where}); available: {schema.names}"
            )

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; seen by DataLoader workers already running, too. Moving to
        another epoch drops a loaded resume state."""
        if epoch != self.epoch:
            self._resume, self._position = None, 0
        self.sampler.set_epoch(epoch)
        self._epoch.fill_(epoch)

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "position"}: the items (records, or batches with batch_size) this object
        has yielded in the epoch, in this process. With num_workers=0 that is the rank's
        stream; inside a DataLoader worker, that worker's own stream (what torchdata's
        StatefulDataLoader saves per worker)."""
        return {"epoch": self.epoch, "position": self._position}

    def consumed_state(self, consumed: int, num_workers: int) -> dict[str, int]:
        """The state after a torch DataLoader with `num_workers` workers has delivered
        `consumed` items of this epoch, for `load_state_dict` before the next iteration."""
        return {"epoch": self.epoch, "position": consumed, "num_workers": num_workers}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue an epoch: the next iteration of that epoch yields exactly the items after
        `position`, in the same order, reading none of the skipped ones. With a
        "num_workers" key (see `consumed_state`), position counts the items a DataLoader with
        that many workers delivered, and each worker skips its own share of them."""
        for key in ("epoch", "position"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"state[{key!r}] must be an int >= 0, got {value!r}")
        self.set_epoch(state["epoch"])
        self._resume = dict(state)
        self._position = state["position"]

    def _resume_role(self, worker: int, workers: int) -> tuple[int, int]:
        """(the worker whose stream this one reads, items of it to skip) for a loaded state;
        (worker, 0) without one. See loader.resume for why the roles rotate."""
        state = self._resume
        if state is None or state["epoch"] != self.epoch:
            return worker, 0
        if "num_workers" not in state:
            return worker, min(state["position"], self._items(worker, workers))
        if state["num_workers"] != workers:
            raise ValueError(
                f"the state counts items of a DataLoader with num_workers={state['num_workers']}, "
                f"this one has num_workers={workers}; resume with the same number of workers"
            )
        streams = max(1, workers)
        skips, due = resume_point(
            [self._items(w, workers) for w in range(streams)], state["position"]
        )
        role = (due + worker) % streams
        return role, skips[role]

    def _items(self, worker: int, workers: int) -> int:
        records = self.sampler.worker_lengths(max(1, workers), self.batch_size or 1)[worker]
        return records if self.batch_size is None else -(-records // self.batch_size)

    def __len__(self) -> int:
        """Records (or batches, with batch_size) this rank yields per epoch; equal on all ranks."""
        n = len(self.sampler)
        return n if self.batch_size is None else -(-n // self.batch_size)

    def _format(self) -> Format:
        name = self.index.format or "parquet"
        if name != "tar":
            return format_for(name, retry=self.retry)
        decode = self.decode or None
        if decode is True:
            from webdataset.autodecode import Decoder, basichandlers

            decode = Decoder([basichandlers])
        return format_for("tar", decode=decode, retry=self.retry)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        sampler = copy.copy(self.sampler)
        sampler.set_epoch(self.epoch)
        role, skip = self._resume_role(worker, workers)
        plan = sampler.plan(role, max(1, workers), align=self.batch_size or 1)
        self._position = skip
        fmt = self._format()
        taken = self._taken(plan, fmt, min(len(plan), skip * (self.batch_size or 1)))
        items = (
            (r for part in taken for r in fmt.records(part))
            if self.batch_size is None
            else _batches(taken, fmt, self.batch_size)
        )
        for item in items:
            self._position += 1
            yield item

    def _taken(self, plan: Plan, fmt: Format, start: int) -> Iterator[Any]:
        """The plan's records in reading order from record `start` on, in chunks of rows."""
        if not plan.shards.size:
            return
        fs, _ = filesystem(self.index.shards[int(plan.shards[0])].url, self.storage_options)

        def read(piece: int) -> Any:
            shard = self.index.shards[int(plan.shards[piece])]
            start, stop = int(plan.starts[piece]), int(plan.stops[piece])
            check_unchanged(fs, shard, self.retry)
            return fmt.read(fs, shard, start, stop, self.columns)

        joined: Any = None
        block: tuple[int, int] | None = None
        with ThreadPoolExecutor(max_workers=self.read_threads) as pool:
            for chunk in plan.chunks(start):
                if chunk.block != block:
                    block = chunk.block
                    joined = fmt.join(list(pool.map(read, range(*block))))
                    # (k+1,) where each piece of the block starts in `joined`
                    offsets = np.concatenate(([0], np.cumsum(plan.sizes[block[0] : block[1]])))
                local = offsets[chunk.pieces - block[0]] + chunk.rows - plan.starts[chunk.pieces]
                yield fmt.take(joined, local)


def _batches(taken: Iterator[Any], fmt: Format, size: int) -> Iterator[dict[str, Any]]:
    """Regroup chunks of rows into batches of `size`; the last may be short."""
    pending: list[Any] = []
    count = 0
    for part in taken:
        pending.append(part)
        count += fmt.num_rows(part)
        if count < size:
            continue
        rows = fmt.concat(pending)
        full = count - count % size
        for lo in range(0, full, size):
            yield fmt.batch(fmt.slice(rows, lo, lo + size))
        pending = [fmt.slice(rows, full, count)] if count > full else []
        count -= full
    if count:
        yield fmt.batch(fmt.concat(pending))
