"""StreamingDataset: the IterableDataset that reads only this rank's and worker's records."""

from __future__ import annotations

import importlib
import inspect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from sampler import DEFAULT_WINDOW, ShardSampler, Topology
from sampler.checks import IntLike, as_int
from sampler.plan import Plan
from sampler.resume import cut_segments

from .amplification import LIMIT as AMPLIFICATION_LIMIT
from .amplification import amplification, log, warning_text
from .batching import regroup
from .cursor import Cursor
from .decode import DecodeSpec, make_decoder
from .distributed_index import shared_index
from .epoch import EpochState
from .formats import Format, format_for
from .formats.tar import check_tar_columns
from .index import ShardIndex
from .kinds import kinds_of
from .locality import NodeOptions
from .options import (
    Transform,
    budget_args,
    check_positive,
    check_transform,
    column_list,
    transformed,
)
from .pipeline import PlanReader
from .retry import RetryPolicy
from .state import Layout, check_state, rank_state
from .stats import LoaderStats, Stats
from .storage import UrlOrPath
from .streams import Stream, is_mixture
from .table import ShardGroups

__all__ = ["StreamingDataset"]

T = TypeVar("T")
# one source: a folder, prefix, glob, URL or list of them, a manifest, a saved index, a
# ShardIndex (or a datasets.Dataset, loader.hf)
Source = UrlOrPath | Sequence[UrlOrPath] | ShardIndex
RECORD_STEP = 1024  # record mode hands out records in lists of this many


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

    `source`: a directory, s3:// prefix, glob, list of URLs, a manifest, a saved index
    (``*.json``) or a ShardIndex; local paths may be pathlib.Paths (os.PathLike), alone or
    in a list; a list of `loader.Stream` makes a mixture (loader.mixture). Rank and world
    size default as the sampler's. Each epoch (`set_epoch`) the rank's records are those of
    ``ShardSampler(...).plan()``: inside a DataLoader with `num_workers` W, worker w reads
    the w-th contiguous part of them, opening its own filesystem; none is lost or read
    twice.

    Records: Parquet rows as ``{column: value}``; tar samples as webdataset's dicts
    (``__key__``, ``__url__``, one bytes entry per extension), decoded when `decode` says,
    as webdataset's ``.decode(*specs)`` does: True for its basic handlers, an image spec
    ("pil", "rgb8", "torchrgb", ...), a handler(key, data), or a list of them (checked
    here: an unknown spec raises ValueError listing webdataset's). A shard cannot run code:
    pickled members (``.pyd``, ``.pkl``, ``.pickle``) are a ShardError naming the shard,
    sample and field unless `allow_pickle` is True, and ``.pth`` members load with
    ``torch.load(weights_only=True)`` unless it is (``.npy``/``.npz`` never unpickle).
    With `batch_size` B it
    yields batches instead (use ``DataLoader(ds, batch_size=None)``): numeric and fixed-length
    list columns as tensors, others as lists; only the rank's last batch may be short.
    A column's kind is decided once, from the schema (loader.kinds): nulls in float
    columns become NaN, in integer columns an error unless `fill_nulls` gives a value
    (``{"label": -1}``); plain list columns whose rows differ in length are an error unless
    `pad` gives a pad value (``{"tokens": 0}``: rows padded to each batch's longest, their
    lengths beside them as ``tokens__len``). A batch is a `loader.Batch` (a dict); a
    DataLoader batching batches (its own batch_size) raises TypeError with the fix.
    `transform` (a function) maps each record, or each batch, where it is made (inside
    DataLoader workers); it returns one item for one, so `len` and resume hold.
    `columns` selects Parquet columns (Hive partition keys included) or tar extensions:
    one name (a str) or a list of them (an extension no indexed sample has: ValueError).
    `source` may also name shards with webdataset's braces (``shard-{000..099}.tar``) or
    be a ``datasets.Dataset`` (its Arrow files, loader.hf).

    Reading: each piece (a shard's row range) is read group by group (Parquet: runs of
    row groups holding 256 KiB or more stored; tar: runs of members holding 1 MiB), which
    is also how its order is shuffled (see sampler.plan). `read_threads` threads fetch
    and decode the groups in the order the reading needs them, ahead of it as far as
    `memory_budget` allows: bytes of decoded groups held plus groups being read (default
    64 MiB; inside a DataLoader each of W workers gets 1/W of it). The groups the reading
    needs at once (one per interleaved piece) are read even when they exceed it. Of what
    is read ahead, only a few groups are decoded before they are needed (one a piece,
    one a decoding thread); the rest waits as fetched bytes.
    `prefetch` (blocks read ahead) is a deprecated alias: it reads ahead that many more
    sets of the block's groups. Batches and records are gathered fresh from the groups: a
    kept batch pins at most the slab of ~2,048 records it was cut from, never a group.
    Transient storage errors (throttling, 5xx, dropped connections, timeouts) are retried
    as `retry` says (a RetryPolicy: attempts, backoff and a deadline; s3fs and botocore
    retry once below it unless storage_options say otherwise); then a ShardError names the
    shard and the last cause.

    Where time goes: `stats()` sums this process's and its DataLoader workers' counters
    (records, bytes fetched, requests, retries, seconds fetching, decoding and waiting,
    and the data-stall fraction of a timed consumer: iterate ``ds.timed(loader)``, or the
    dataset itself without workers); `log_every` seconds logs them in one line (INFO).

    Resume: `state_dict`, `consumed_state`, `load_state_dict` (see loader.state), also in
    another number of ranks or workers.

    Several epochs from remote storage: `cache_dir` (a local folder the ranks of a node
    share) keeps the remote bytes read, so a later epoch reads them from disk;
    `cache_limit` (bytes, or "50GB") bounds it, evicting by the plan's next use
    (loader.cache). ``locality="node"`` keeps each node's records the same every epoch
    (reshuffled inside the node), so the cache holds what the node reads next; nodes are
    `local_world_size` consecutive ranks (default: torchrun's LOCAL_WORLD_SIZE).

    Integer arguments (seed, ranks, batch_size, window, read_threads, memory_budget) take
    Python ints or numpy integers, as torch does; bools, floats and other types raise
    ValueError.

    `set_epoch` reaches workers started earlier (``persistent_workers=True``): the epoch
    lives in a shared-memory tensor (loader.epoch), which also lets a second full pass
    over one epoch without `set_epoch` warn once.
    """

    # The class a list of `loader.Stream` makes: loader.mixture.MixtureDataset, which
    # builds on this one and registers itself here when imported (imported here when first
    # needed), so that the module imports point one way: mixture -> dataset.
    mixture_class: ClassVar[type[StreamingDataset] | None] = None
    # what help() and inspect.signature show: __init__'s parameters, not __new__'s (set
    # below the class; __new__ only picks the class, and takes whatever __init__ takes)
    __signature__: ClassVar[inspect.Signature]

    def __new__(cls, source: Any = None, *args: Any, **kwargs: Any) -> StreamingDataset:
        """A list of `loader.Stream` makes a mixture (loader.mixture.MixtureDataset)."""
        if cls is StreamingDataset and is_mixture(source):
            if StreamingDataset.mixture_class is None:
                importlib.import_module(".mixture", __package__)  # it registers itself
            assert StreamingDataset.mixture_class is not None
            return super().__new__(StreamingDataset.mixture_class)
        return super().__new__(cls)

    def __init__(
        self,
        source: Source | Sequence[Stream],
        *,
        epoch_size: IntLike | None = None,
        columns: str | Sequence[str] | None = None,
        shuffle: bool = True,
        seed: IntLike = 0,
        drop_last: bool = False,
        num_replicas: IntLike | None = None,
        rank: IntLike | None = None,
        batch_size: IntLike | None = None,
        storage_options: dict[str, Any] | None = None,
        window: IntLike = DEFAULT_WINDOW,
        decode: DecodeSpec = False,
        allow_pickle: bool = False,
        read_threads: IntLike = 16,
        memory_budget: IntLike | None = None,
        prefetch: IntLike | None = None,
        retry: RetryPolicy | None = None,
        fill_nulls: Mapping[str, Any] | None = None,
        pad: Mapping[str, Any] | None = None,
        log_every: float | None = None,
        transform: Transform | None = None,
        cache_dir: UrlOrPath | None = None,
        cache_limit: int | str | None = None,
        locality: str | None = None,
        local_world_size: IntLike | None = None,
    ) -> None:
        super().__init__()
        if epoch_size is not None:
            raise ValueError(
                f"epoch_size={epoch_size!r} is for mixtures (a list of Stream); one source's "
                "epoch is all its records"
            )
        self._read_options(
            batch_size,
            columns,
            decode,
            allow_pickle,
            read_threads,
            memory_budget,
            prefetch,
            retry,
            pad,
            log_every,
            transform,
        )
        topo = Topology.resolve(num_replicas, rank)
        self.node = NodeOptions.check(
            cache_dir, cache_limit, locality, local_world_size, topo.world_size
        )
        self.storage_options = dict(storage_options or {})
        self.index = _shared_index(source, self.storage_options, self.retry)
        # Parquet: the asked columns as every shard gives them (errors name the shard)
        self.schema = (
            None if self.index.format == "tar" else self.index.columns_schema(self.columns)
        )
        if self.index.format == "tar":
            check_tar_columns(self.index.shards, self.columns)
        self.kinds = (
            kinds_of(self.schema, fill_nulls, pad)
            if self.schema is not None and self.batch_size is not None
            else None
        )
        # where each shard's read groups lie: the reading order shuffles group by group
        self.groups = ShardGroups(self.index.shards, self._format().groups)
        self.sampler = ShardSampler(
            self.index,
            topo.world_size,
            topo.rank,
            shuffle,
            seed,
            drop_last,
            window,
            self.groups,
            self.node.node_size,
        )
        self._state = EpochState()  # the epoch, shared with DataLoader workers
        self._cursor = Cursor()  # items handed out in this epoch, in this process
        self._resume: dict[str, Any] | None = None  # the loaded state, until another epoch
        self._role: int | None = None  # which worker's part this worker reads (loader.state)

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
        if epoch != self.epoch:
            self._resume = None
            self._cursor.reset()
            self._role = None
        self.sampler.set_epoch(epoch)
        self._state.select(epoch)

    def _layout(self, num_workers: int) -> Layout:
        return Layout(
            self.sampler.num_replicas,
            num_workers,
            self.batch_size or 0,
            self.sampler.num_records,
            self.sampler.drop_last,
            self.node.node_size or 0,
        )

    def stats(self) -> dict[str, Any]:
        """Counters of this process and its DataLoader workers, summed (see loader.stats):
        records, bytes_fetched, requests, retries, fetch_s / decode_s (seconds, summed over
        reader threads), wait_s (the reading thread waiting for a group), consumer_wait_s /
        consumer_wall_s and their ratio `stall_fraction` (None unless a consumer was timed:
        ``ds.timed(loader)``, or iterating the dataset without workers), peak_held_bytes;
        with a cache_dir, cache_hit_bytes (served from the node cache, not counted in
        bytes_fetched) and cache_held_bytes (what the cache folder holds now, for the
        whole node)."""
        totals: dict[str, Any] = self._stats.totals()
        folders = {n.cache_dir: n for n in getattr(self, "nodes", [self.node])}
        totals["cache_held_bytes"] = sum(n.held_bytes() for n in folders.values())
        return totals

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
        ranks. In an epoch resumed in another layout, what this rank yields of the rest."""
        layout = self._layout(0)
        base = layout.base_of(self._resume, self.epoch)
        n = sum(b - a for *_, a, b in layout.streams(base)[self.sampler.rank][0])
        return n if self.batch_size is None else -(-n // self.batch_size)

    def _format(self) -> Format:
        return self._make_format(self.index, self.schema, self.kinds)

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

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        layout = self._layout(workers)
        segments, skip, self._role = self._worker_part(layout, worker)
        self._cursor.reset(skip)
        records = sum(b - a for *_, a, b in segments)
        start = min(records, skip * layout.item)
        fmt = self._format()
        root = layout.root(layout.base_of(self._resume, self.epoch))
        stats = self._stats.mine(0 if info is None else 1 + worker)
        reader = PlanReader(
            self.index,
            fmt,
            columns=self.columns,
            storage_options=self.storage_options,
            retry=self.retry,
            read_threads=self.read_threads,
            prefetch=self.prefetch,
            memory_budget=self.memory_budget // max(1, workers),
            stats=stats,
            cache=self.node.cache(self.sampler, self._name_of, worker, workers),
        )
        runs = [
            (self._plan(root, rank, worker), a, b)
            for rank, worker, a, b in cut_segments(segments, start, records)
        ]
        if worker == 0 and runs and self._state.once():
            self._warn_amplified(runs[0][0], workers)
        taken = reader.parts(runs, self.batch_size or RECORD_STEP)
        if self.batch_size is None:
            deliveries: Iterator[Any] = (fmt.records(part) for part in taken)
        else:
            batches = regroup((fmt.batch(part) for part in taken), self.batch_size, self.pad)
            deliveries = ([b] for b in batches)
        return self._hand_out(deliveries, stats, info is not None, worker)

    def _hand_out(
        self, deliveries: Iterator[Any], stats: Stats, in_worker: bool, worker: int
    ) -> Iterator[Any]:
        """The items of the deliveries, transformed, as the pass's iterator: the consumer
        is timed where it runs in this process (no DataLoader workers); items are handed
        out by chain's C loop straight from each list's iterator."""
        first = worker == 0  # the main process or worker 0: logs, marks the pass finished
        self._state.begin(in_worker, first, self.sampler.shuffle)
        log = (lambda: self._stats.maybe_log(self.log_every)) if first and self.log_every else None
        handed = self._cursor.hand_out(
            transformed(deliveries, self.transform),
            stats.row,
            batches=self.batch_size is not None,
            timed=not in_worker,
            tick=log,
            done=lambda: self._state.finish(first),
        )
        return itertools.chain.from_iterable(handed)

    def _warn_amplified(self, plan: Plan, workers: int) -> None:
        """One WARNING when a reader fetches much more than its records' bytes
        (loader.amplification)."""
        measured = amplification(self.index, plan)
        if measured is not None and measured[0] > AMPLIFICATION_LIMIT:
            log.warning(warning_text(*measured, ranks=self.sampler.num_replicas, workers=workers))

    def _name_of(self, shard: int) -> tuple[str, str | None]:
        """(url, version) of a shard: what its node cache blocks are named by."""
        entry = self.index.shards[shard]
        return entry.url, entry.version

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
            self.groups,
            root.local_world_size or None,
        )
        sampler.set_epoch(self.epoch)
        return sampler.plan(worker, max(1, root.num_workers), align=root.item)


def init_signature(cls: type) -> inspect.Signature:
    """The signature of `cls(...)`: its __init__'s, without self."""
    sig = inspect.signature(cls.__init__)  # type: ignore[misc]
    params = list(sig.parameters.values())[1:]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


StreamingDataset.__signature__ = init_signature(StreamingDataset)
