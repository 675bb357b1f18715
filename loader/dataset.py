"""StreamingDataset: the IterableDataset that reads only this rank's and worker's records."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from sampler import DEFAULT_WINDOW, ShardSampler, Topology
from sampler.plan import Plan
from sampler.resume import cut_segments

from .batching import regroup
from .distributed_index import shared_index
from .formats import Format, format_for
from .index import ShardIndex
from .kinds import kinds_of
from .pipeline import PlanReader
from .retry import RetryPolicy
from .state import Layout, check_state

__all__ = ["StreamingDataset"]

RECORD_STEP = 256  # record mode gathers this many rows at a time


def _check_positive(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return value


def _shared_index(
    source: Any, storage_options: dict[str, Any] | None, retry: RetryPolicy
) -> ShardIndex:
    """Build (or load) the index once per job: under an initialized process group, rank 0
    lists the source and every rank indexes 1/R of the shards (a saved index is read by
    rank 0 and broadcast); a failure on any rank is raised on all of them, so no rank
    waits forever (loader.distributed_index)."""
    return shared_index(source, storage_options, retry)


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
    A column's kind is decided once, from the schema (loader.kinds): nulls in float
    columns become NaN, in integer columns an error unless `fill_nulls` gives a value
    (``{"label": -1}``); plain list columns whose rows differ in length are an error unless
    `pad` gives a pad value (``{"tokens": 0}``: rows padded to each batch's longest).
    `columns` selects Parquet columns (Hive partition keys included) or tar extensions.

    Reading: a block of `window` pieces (shard row ranges) is read and decoded by
    `read_threads` threads and joined there (Parquet: numeric columns copied into one
    contiguous buffer each, reused block after block); the next `prefetch` blocks are read
    while one is consumed, so memory holds about (1 + prefetch) decoded blocks. Each batch
    or record is gathered fresh from the block: what you keep pins no block. Transient
    storage errors (throttling, 5xx, dropped connections, timeouts) are retried as `retry`
    says (a RetryPolicy: attempts and backoff); then the error names the shard.

    Resume: `state_dict`, `consumed_state`, `load_state_dict` (see loader.state), also in
    another number of ranks or workers.

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
        prefetch: int = 1,
        retry: RetryPolicy | None = None,
        fill_nulls: Mapping[str, Any] | None = None,
        pad: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = _check_positive("batch_size", batch_size)
        self.read_threads = _check_positive("read_threads", read_threads) or 1
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (blocks read ahead), got {prefetch!r}")
        self.prefetch = prefetch
        topo = Topology.resolve(num_replicas, rank)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.index = _shared_index(source, self.storage_options, self.retry)
        self.columns = None if columns is None else list(columns)
        # Parquet: the asked columns as every shard gives them (errors name the shard)
        self.schema = (
            None if self.index.format == "tar" else self.index.columns_schema(self.columns)
        )
        self.pad = dict(pad or {})
        self.kinds = (
            kinds_of(self.schema, fill_nulls, pad)
            if self.schema is not None and self.batch_size is not None
            else None
        )
        self.sampler = ShardSampler(
            self.index, topo.world_size, topo.rank, shuffle, seed, drop_last, window
        )
        self.decode = decode
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._position = 0  # items yielded in this epoch by this object, in this process
        self._resume: dict[str, Any] | None = None  # the loaded state, until another epoch

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

    def _layout(self, num_workers: int) -> Layout:
        return Layout(
            self.sampler.num_replicas,
            num_workers,
            self.batch_size or 0,
            self.sampler.num_records,
            self.sampler.drop_last,
        )

    def state_dict(self) -> dict[str, Any]:
        """The items (records, or batches with batch_size) this object has yielded in the
        epoch, in this process, as a state for `load_state_dict`. Iterated directly
        (num_workers=0), that is the rank's stream: a full state (see `consumed_state`).
        Inside a DataLoader worker, that worker's own count {"epoch", "position"}: what
        torchdata's StatefulDataLoader saves per worker."""
        info = get_worker_info()
        if info is None:
            return self.consumed_state(self._position, 0)
        state: dict[str, Any] = {"epoch": self.epoch, "position": self._position}
        base = self._layout(info.num_workers).base_of(self._resume, self.epoch)
        if base is not None:
            state["elastic"] = base
        return state

    def consumed_state(self, consumed: int, num_workers: int) -> dict[str, Any]:
        """The state after a torch DataLoader with `num_workers` workers has delivered
        `consumed` items of this epoch on this rank (every rank the same count, as in a
        DDP loop), for `load_state_dict` in the next run: JSON-serializable integers."""
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "position": consumed,
            "num_workers": num_workers,
            "num_replicas": self.sampler.num_replicas,
            "batch_size": self.batch_size or 0,
        }
        base = self._layout(num_workers).base_of(self._resume, self.epoch)
        if base is not None:
            state["elastic"] = base
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue an epoch: the next iteration of that epoch yields exactly the items not
        yet consumed, reading none of the others (see loader.state).

        Same layout (ranks, workers, batch size): the same items in the same order.
        Another layout (an elastic resume, e.g. 3 ranks before and 2 now): what no rank
        consumed is cut into equal contiguous parts over the new ranks and workers, so that
        across the epoch every record is read once; with drop_last the last (fewer than
        num_replicas) remaining records are left out, without it the new ranks pad by
        wrapping to the start of the remainder, as DistributedSampler pads.
        """
        state = check_state(state)
        self.set_epoch(state["epoch"])
        self._resume = state
        self._position = state["position"]

    def __len__(self) -> int:
        """Records (or batches, with batch_size) this rank yields per epoch; equal on all
        ranks. In an epoch resumed in another layout, what this rank yields of the rest."""
        layout = self._layout(0)
        base = layout.base_of(self._resume, self.epoch)
        n = sum(b - a for *_, a, b in layout.streams(base)[self.sampler.rank][0])
        return n if self.batch_size is None else -(-n // self.batch_size)

    def _format(self) -> Format:
        name = self.index.format or "parquet"
        if name != "tar":
            return format_for(
                name,
                retry=self.retry,
                schema=self.schema,
                partitioning=self.index.partitioning,
                kinds=self.kinds,
            )
        decode = self.decode or None
        if decode is True:
            from webdataset.autodecode import Decoder, basichandlers

            decode = Decoder([basichandlers])
        return format_for("tar", decode=decode, retry=self.retry)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        layout = self._layout(workers)
        segments, skip = layout.worker_part(self._resume, self.epoch, self.sampler.rank, worker)
        self._position = skip
        records = sum(b - a for *_, a, b in segments)
        start = min(records, skip * layout.item)
        fmt = self._format()
        root = layout.root(layout.base_of(self._resume, self.epoch))
        step = self.batch_size or RECORD_STEP
        reader = PlanReader(
            self.index,
            fmt,
            columns=self.columns,
            storage_options=self.storage_options,
            retry=self.retry,
            read_threads=self.read_threads,
            prefetch=self.prefetch,
        )
        runs = [
            (self._plan(root, rank, worker), a, b)
            for rank, worker, a, b in cut_segments(segments, start, records)
        ]
        taken = reader.parts(runs, step)
        items = (
            (r for part in taken for r in fmt.records(part))
            if self.batch_size is None
            else regroup((fmt.batch(part) for part in taken), self.batch_size, self.pad)
        )
        for item in items:
            self._position += 1
            yield item

    def _plan(self, root: Layout, rank: int, worker: int) -> Plan:
        """Plan `worker` of `rank` in the layout the epoch started with."""
        sampler = ShardSampler(
            self.sampler.sizes,
            root.num_replicas,
            rank,
            self.sampler.shuffle,
            self.sampler.seed,
            self.sampler.drop_last,
            self.sampler.window,
        )
        sampler.set_epoch(self.epoch)
        return sampler.plan(worker, max(1, root.num_workers), align=root.item)
