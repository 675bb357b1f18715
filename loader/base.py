"""What a StreamingDataset and a MixtureDataset share: the read options, the epoch and its
resume states, the hand-out of items, and the counters.

`DatasetBase` holds no source: `loader.dataset.StreamingDataset` (one source) and
`loader.mixture.MixtureDataset` (several Streams) build on it, each with its own index,
sampler and `__iter__`; the rest (set_epoch, state_dict / consumed_state / load_state_dict,
len, stats) works the same for both, through the `_layout` each gives.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from shardstream.sampler import MixtureSampler, ShardSampler, Topology
from shardstream.sampler.checks import IntLike, as_int

from . import peek
from .cache.locality import NodeOptions
from .cursor import Cursor, first_noted
from .epoch import EpochState
from .formats import Format, format_for
from .formats.tar.decode import DecodeSpec, make_decoder
from .index.shard_index import ShardIndex
from .options import (
    Transform,
    budget_args,
    check_positive,
    check_transform,
    column_list,
    transformed,
)
from .ranks import Ranks
from .state import Layout, check_state, rank_state
from .stats import LoaderStats, Stats
from .storage.retry import RetryPolicy
from .storage.trips import Window
from .tokens.packing import Packing

__all__ = ["RECORD_STEP", "DatasetBase", "init_signature"]

log = logging.getLogger(__name__)

T = TypeVar("T")
RECORD_STEP = 1024  # record mode hands out records in lists of this many


class DatasetBase(IterableDataset[Any]):
    """The machinery a dataset has whatever its sources (see the module docstring); not
    made directly. A subclass sets `sampler` and `node`, calls `_read_options` and
    `_start_epochs` in its `__init__`, and gives `_layout` and `__iter__`."""

    sampler: ShardSampler | MixtureSampler
    node: NodeOptions
    packings: list[Packing]  # with pack=: one a source (a mixture: one a stream)
    _building: Window | None = None  # the construction's requests (loader.storage.trips)
    _built: tuple[int, int] = (0, 0)  # then their count and how many were in line
    # what help() and inspect.signature show: __init__'s parameters (set below each class:
    # StreamingDataset's __new__ only picks the class, and takes whatever __init__ takes)
    __signature__: ClassVar[inspect.Signature]

    def _topology(self, num_replicas: IntLike | None, rank: IntLike | None) -> Topology:
        """The rank and world size to plan with now; provisional while no process group
        is initialized and they were not both given (loader.ranks): `_settle` replans
        when a group comes."""
        self._ranks = Ranks(num_replicas, rank)
        self._sized: int | None = None  # len() given under a provisional topology
        return self._ranks.topology

    def _settle(self, strict: bool = True) -> None:
        """Take the process group's rank and world size if one was initialized since the
        dataset was built (`_adopt` replans); `strict`: raise if the rank cannot be known
        yet (loader.ranks)."""
        topo = self._ranks.settle(strict)
        if topo is None:
            return
        before = (self.sampler.rank, self.sampler.num_replicas)
        self._adopt(topo)
        self._sampler_epoch(self.epoch)
        log.info(
            "%s: the process group was initialized after the dataset was built: reading as "
            "rank %d of %d (planned as rank %d of %d until now)",
            type(self).__name__,
            topo.rank,
            topo.world_size,
            *before,
        )
        if self._sized is None or get_worker_info() is not None:
            return  # a forked worker settles its own copy: the main process says it
        if self._sized != len(self):
            log.warning(
                "len(dataset) was %d before init_process_group and is %d now that the "
                "dataset reads as rank %d of %d: anything sized from the earlier value (a "
                "learning-rate schedule, a progress bar) is off; take len() after "
                "init_process_group, or build the dataset after it",
                self._sized,
                len(self),
                topo.rank,
                topo.world_size,
            )
            self._sized = None

    def _adopt(self, topo: Topology) -> None:
        """Replan for `topo` (a process group found after construction)."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for spawned DataLoader workers (or any copy): the group's ranks first,
        where a group came after construction (a spawned worker does not see it)."""
        self._settle(strict=False)
        return self.__dict__.copy()

    def _start_epochs(self) -> None:
        """The epoch (shared with DataLoader workers), the items handed out, no state."""
        self._state = EpochState()  # the epoch, shared with DataLoader workers
        self._cursor = Cursor()  # items handed out in this epoch, in this process
        self._resume: dict[str, Any] | None = None  # the loaded state, until another epoch
        self._role: int | None = None  # which worker's part this worker reads (loader.state)
        if self._building is not None:  # the construction ends here
            self._built, self._building = self._building.close(), None

    def _read_options(
        self,
        batch_size: IntLike | None,
        columns: str | Sequence[str] | None,
        decode: DecodeSpec,
        allow_pickle: bool,
        read_threads: IntLike,
        memory_budget: IntLike | None,
        prefetch: IntLike | None,
        retry: RetryPolicy | None,
        pad: Mapping[str, Any] | None,
        log_every: float | None,
        transform: Transform | None = None,
    ) -> None:
        """The options every source of a dataset is read with, checked (ValueError or
        TypeError naming the value) before any storage is touched."""
        self._building = Window()  # the construction's requests from here on
        self.batch_size = check_positive("batch_size", batch_size)
        self.read_threads = check_positive("read_threads", read_threads) or 1
        self.memory_budget, self.prefetch = budget_args(memory_budget, prefetch)
        if log_every is not None and not (isinstance(log_every, int | float) and log_every > 0):
            raise ValueError(f"log_every must be seconds > 0 or None, got {log_every!r}")
        self.log_every = log_every
        self._stats = LoaderStats()
        self.retry = retry or RetryPolicy()
        self.columns = column_list(columns)
        self.transform = check_transform(transform)
        self.decode = decode
        if not isinstance(allow_pickle, bool):
            raise TypeError(f"allow_pickle must be True or False, got {allow_pickle!r}")
        self.allow_pickle = allow_pickle
        # checked here, not in a reader thread
        self._decoder = make_decoder(decode, allow_pickle)
        self.pad = dict(pad or {})

    @property
    def epoch(self) -> int:
        return self._state.epoch

    def set_epoch(self, epoch: IntLike) -> None:
        """Select the epoch; seen by DataLoader workers already running, too. Moving to
        another epoch drops a loaded resume state."""
        epoch = as_int("epoch", epoch, 0)
        self._settle(strict=False)
        if epoch != self.epoch:
            self._resume = None
            self._cursor.reset()
            self._role = None
        self._sampler_epoch(epoch)
        self._state.select(epoch)

    def _sampler_epoch(self, epoch: int) -> None:
        """Set the sampler's epoch (a mixture resumed in another layout keeps its own)."""
        self.sampler.set_epoch(epoch)

    def _layout(self, num_workers: int) -> Layout:
        """The job's layout with `num_workers` DataLoader workers (0: none)."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Counters of this process and its DataLoader workers, summed (see loader.stats):
        records, bytes_fetched, requests, retries, fetch_s / decode_s (seconds, summed over
        reader threads), wait_s (the reading thread waiting for a group), consumer_wait_s /
        consumer_wall_s and their ratio `stall_fraction` (None unless a consumer was timed:
        ``ds.timed(loader)``, or iterating the dataset without workers), peak_held_bytes;
        first_requests / first_in_line / first_item_s (a reader's storage requests before
        its first item, the construction's too; how many stood in line; its seconds, most);
        with `pack`, "pack": the epoch's tokens and documents, blocks each rank makes and
        tokens_dropped (in no rank's block; a mixture: per stream name, of one pass); with
        a cache_dir, cache_hit_bytes (served from the node cache, not counted in
        bytes_fetched) and cache_held_bytes (what the cache folder holds now, whole node)."""
        totals: dict[str, Any] = self._stats.totals()
        folders = {n.cache_dir: n for n in self._cache_nodes()}
        totals["cache_held_bytes"] = sum(n.held_bytes() for n in folders.values())
        replicas = self.sampler.num_replicas
        if len(self.packings) == 1:
            totals["pack"] = self.packings[0].summary(replicas)
        elif self.packings:  # a mixture: per stream, a pass of it
            names = getattr(self, "names", [])
            totals["pack"] = {n: p.summary(replicas) for n, p in zip(names, self.packings)}
        return totals

    def _cache_nodes(self) -> list[NodeOptions]:
        """The node options of every cache this dataset reads through (a mixture: one a
        stream)."""
        return [self.node]

    def head(self, n: IntLike) -> list[Any]:
        """The first `n` items this rank yields in this epoch's order (records, batches or
        blocks, transformed), read apart from the dataset's own pass (loader.peek)."""
        return peek.head(self, n)

    def take(self, n: IntLike) -> list[dict[str, Any]]:
        """The first `n` records of this rank in this epoch's order, as dicts, before
        `transform` (loader.peek): a look at what a dataset of batches is made of."""
        return peek.take(self, n)

    def reset_stats(self) -> None:
        """Zero the counters (of this process and its workers)."""
        self._stats.reset()

    def timed(self, items: Iterable[T]) -> Iterator[T]:
        """`items` (e.g. a DataLoader over this dataset), with the time the consumer waits
        for each one counted: `stats()["stall_fraction"]` then says what share of the loop's
        wall time went to waiting for data. Logs every `log_every` seconds too."""
        stats = self._stats.mine(0)
        return self._stats.timed(items, stats, lambda: self._stats.maybe_log(self.log_every))

    def state_dict(self) -> dict[str, Any]:
        """The items (records, or batches with batch_size) this object has yielded in the
        epoch, in this process, as a state for `load_state_dict`, with the layout they were
        counted in. Iterated directly (num_workers=0), that is the rank's stream: a rank
        state (see `consumed_state`). Inside a DataLoader worker, that worker's own count
        (with its rank and worker): what torchdata's StatefulDataLoader saves per worker.

        In the main process after DataLoader workers read this epoch, this object yielded
        nothing itself, and its count would restart the epoch on resume: RuntimeError
        naming the two ways that count right (StatefulDataLoader, `consumed_state`)."""
        self._settle()
        info = get_worker_info()
        if info is None:
            if self._state.workers_read:
                raise RuntimeError(
                    "state_dict() was called in the main process, but DataLoader workers "
                    f"read epoch {self.epoch}: this object yielded nothing here, so its "
                    "position (0) would restart the epoch. Save torchdata's "
                    "StatefulDataLoader(ds, batch_size=None, num_workers=W).state_dict() "
                    "(it asks the workers), or ds.consumed_state(items_your_loop_took, W)"
                )
            return self.consumed_state(self._cursor.consumed(), 0)
        layout = self._layout(info.num_workers)
        if self._role is None:  # not iterated yet: where this worker's reading will start
            _, skip, self._role = self._worker_part(layout, info.id)
            self._cursor.reset(skip)
        state = {
            **self._layout_state(layout),
            "position": self._cursor.consumed(),
            "rank": self.sampler.rank,
            "worker": self._role,
        }
        return state

    def consumed_state(self, consumed: int, num_workers: int) -> dict[str, Any]:
        """The state after a torch DataLoader with `num_workers` workers has delivered
        `consumed` items of this epoch on this rank (every rank the same count, as in a
        DDP loop), for `load_state_dict` in the next run: JSON-serializable integers, the
        same on every rank, loadable into any number of ranks or workers."""
        self._settle()
        return {**self._layout_state(self._layout(num_workers)), "position": consumed}

    def _layout_state(self, layout: Layout) -> dict[str, Any]:
        """The epoch and the layout it is read in, as a state records them."""
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "num_workers": layout.num_workers,
            "num_replicas": layout.num_replicas,
            "batch_size": layout.batch_size,
            "num_records": layout.num_records,
            **self.node.state(),
        }
        base = layout.base_of(self._resume, self.epoch)
        if base is not None:
            state["elastic"] = base
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue an epoch: the next iteration of that epoch yields exactly the items not
        yet consumed, reading none of the others (see loader.state).

        `state`: one this dataset's `state_dict` or `consumed_state` gave, or a torchdata
        StatefulDataLoader's whole ``state_dict()`` (its workers' counts are gathered into
        the rank's). Same layout (ranks, workers, batch size): the same items in the same
        order. Another layout (an elastic resume, e.g. 3 ranks before and 2 now): what no
        rank consumed is cut into equal contiguous parts over the new ranks and workers,
        so that across the epoch every record is read once; with drop_last the last (fewer
        than num_replicas) remaining records are left out, without it the new ranks pad by
        wrapping to the start of the remainder, as DistributedSampler pads. One worker's
        state (what a StatefulDataLoader hands each worker) resumes only in the layout and
        on the rank it was saved in; a state of another dataset size never resumes: both
        are a ValueError naming the layouts.
        """
        state = self._accept(state)
        self.set_epoch(state["epoch"])
        self._resume = state
        self._cursor.reset(state["position"])
        self._role = None

    def _accept(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state to resume from, checked against this job (loader.state)."""
        self._settle()
        gathered = rank_state(state)
        state = check_state(gathered if gathered is not None else state)
        info = get_worker_info()
        layout = self._layout(info.num_workers if info is not None else 0)
        layout.check(state, self.sampler.rank, info.id if info is not None else None)
        return state

    def _worker_part(self, layout: Layout, worker: int) -> tuple[list[Any], int, int]:
        """(segments, items to skip, role) of this rank's `worker` in this epoch."""
        if self._resume is not None and self._resume["epoch"] == self.epoch:
            layout.check(self._resume, self.sampler.rank, worker)
        return layout.worker_part(self._resume, self.epoch, self.sampler.rank, worker)

    def __len__(self) -> int:
        """Records (or batches, with batch_size) this rank yields per epoch; equal on all
        ranks. In an epoch resumed in another layout, what this rank yields of the rest.
        Built before ``init_process_group``, the dataset counts for the group's rank once
        the group is initialized (loader.ranks)."""
        self._settle()
        layout = self._layout(0)
        base = layout.base_of(self._resume, self.epoch)
        n = sum(b - a for *_, a, b in layout.streams(base)[self.sampler.rank][0])
        n = n if self.batch_size is None else -(-n // self.batch_size)
        if not self._ranks.final:
            self._sized = n
        return n

    def _make_format(
        self,
        index: ShardIndex,
        schema: Any,
        kinds: dict[str, Any] | None,
        lengths: dict[str, int] | None = None,
    ) -> Format:
        """A reader of `index`'s format for this dataset's options; `lengths` (plain list
        columns' row length) may be shared by the formats of several streams."""
        name = index.format or "parquet"
        if name != "tar":
            return format_for(
                name,
                retry=self.retry,
                schema=schema,
                partitioning=index.partitioning,
                kinds=kinds,
                lengths=lengths,
                file_schemas=index.schemas,
            )
        return format_for("tar", decode=self._decoder, retry=self.retry)

    def _hand_out(
        self,
        deliveries: Iterator[Any],
        stats: Stats,
        in_worker: bool,
        worker: int,
        records: int,
        item: int,
    ) -> Iterator[Any]:
        """The items of the deliveries, transformed, as the pass's iterator: the consumer
        is timed where it runs in this process (no DataLoader workers); items are handed
        out by chain's C loop straight from each list's iterator. `records`: what this
        worker's part holds (whole, before any skip), in items of `item` records."""
        first = worker == 0  # the main process or worker 0: logs, marks the pass finished
        built, self._built = self._built, (0, 0)  # the construction's: in one pass only
        deliveries = first_noted(deliveries, stats, Window(), built)
        self._state.begin(in_worker, first, self.sampler.shuffle)
        log = (lambda: self._stats.maybe_log(self.log_every)) if first and self.log_every else None
        handed = self._cursor.hand_out(
            transformed(deliveries, self.transform, batches=self.batch_size is not None),
            stats.row,
            batches=self.batch_size is not None,
            timed=not in_worker,
            tick=log,
            done=lambda: self._state.finish(first),
            total=-(-records // item),
        )
        return itertools.chain.from_iterable(handed)


def init_signature(cls: type) -> inspect.Signature:
    """The signature of `cls(...)`: its __init__'s, without self."""
    sig = inspect.signature(cls.__init__)  # type: ignore[misc]
    params = list(sig.parameters.values())[1:]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
