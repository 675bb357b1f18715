"""StreamingDataset: the IterableDataset that reads only this rank's and worker's records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow.compute as pc
from torch.utils.data import get_worker_info

from shardstream.sampler import DEFAULT_WINDOW, ShardSampler, Topology
from shardstream.sampler.checks import IntLike, as_int
from shardstream.sampler.epoch import shard_order
from shardstream.sampler.plan import Plan
from shardstream.sampler.resume import cut_segments

from .base import RECORD_STEP, DatasetBase, init_signature
from .cache.locality import NodeOptions
from .columns.batch_format import arrow_batches, arrow_kinds, check_batch_format, shaped
from .columns.batching import regroup
from .columns.kinds import Kind, kinds_of
from .formats import Format
from .formats.parquet.format import ParquetFormat
from .formats.tar.decode import DecodeSpec
from .formats.tar.format import check_tar_columns
from .index.shard_index import ShardIndex
from .index.shared import shared_index
from .index.table import ShardGroups
from .mixture import MixtureDataset
from .options import Transform, check_batch_options, check_decode
from .read.amplification import LIMIT as AMPLIFICATION_LIMIT
from .read.amplification import job_amplification, log, warning_text
from .read.plan_reader import RECORD_SLAB, SLAB, PlanReader
from .selection import check_filter, check_split, select
from .state import Layout
from .storage.filesystems import UrlOrPath
from .storage.retry import RetryPolicy
from .streams import Schedule, Stream, is_mixture
from .tokens.pack import Pack, check_token_column, pack_columns
from .tokens.packer import items
from .tokens.packing import Packing

__all__ = ["StreamingDataset"]

# one source: a folder, prefix, glob, URL or list of them, a manifest, a saved index, a
# ShardIndex (or a datasets.Dataset, loader.index.hf)
Source = UrlOrPath | Sequence[UrlOrPath] | ShardIndex


class StreamingDataset(DatasetBase):
    """Streams this rank's share of a sharded dataset, as a torch IterableDataset.

    `source`: a folder, s3:// (gs://, az://, https://) prefix or URL, a glob, brace names,
    a list of them, a manifest, a saved index, a ShardIndex or a ``datasets.Dataset``, of
    Parquet, Arrow IPC or tar shards. A list of `Stream` makes a mixture (a MixtureDataset,
    which isinstance still calls a StreamingDataset).

    Records or batches: without `batch_size` it yields records (Parquet and Arrow rows as
    dicts, tar samples as webdataset's dicts); with `batch_size` B, batches of B records
    (tensors where the column allows; use ``DataLoader(ds, batch_size=None)``); with
    ``pack=Pack(...)``, fixed-length blocks of token ids.

    Ranks: each rank reads only the records ``ShardSampler(...).plan()`` gives it, as many
    on every rank; `num_replicas` and `rank` default to the process group's, or torchrun's.
    Workers: inside a DataLoader, worker w reads the w-th contiguous part of the rank's
    records, with its own filesystem; none is lost or read twice.
    Epochs: call ``set_epoch(e)`` before each one (persistent workers see it too); the
    shuffles are keyed by `seed` and the epoch.
    Resume: save `state_dict()` (or ``consumed_state(n, num_workers)``) and give it to
    `load_state_dict`, also in a job of another number of ranks or workers.
    Where time goes: `stats()`, and ``timed(loader)`` for the consumer's waits.

    Every argument (its type, default, and what it refuses): docs/reference.md.
    """

    sampler: ShardSampler

    def __new__(cls, source: Any = None, *args: Any, **kwargs: Any) -> StreamingDataset:
        """A list of `loader.Stream` makes a mixture: a MixtureDataset (loader.mixture),
        made and initialized here. It is registered as a StreamingDataset (isinstance and
        issubclass hold) without being a subclass, so Python does not run
        StreamingDataset.__init__ on it after this returns; both build on DatasetBase."""
        if cls is StreamingDataset and is_mixture(source):
            mixture: Any = MixtureDataset(source, *args, **kwargs)
            return mixture  # type: ignore[no-any-return]
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
        pack: Pack | None = None,
        filter: pc.Expression | None = None,
        split: tuple[float, float] | None = None,
        batch_format: str = "torch",
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("epoch_size", epoch_size), ("schedule", schedule)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} is for mixtures (a list of Stream); one source's "
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
        self.batch_format = check_batch_format(batch_format, self.batch_size, pack)
        self.filter, self.split = check_filter(filter), check_split(split)
        topo = self._topology(num_replicas, rank)
        self._node_args = (cache_dir, cache_limit, locality, local_world_size)
        self.node = NodeOptions.check(*self._node_args, topo.world_size)
        self.storage_options = dict(storage_options or {})
        if pack is not None:
            self.columns = pack_columns(pack, self.columns, fill_nulls, pad, locality)
        if pack is None:
            check_batch_options(self.batch_size, fill_nulls, pad, self.batch_format)
        # built by the ranks (no saved index): each scans the footers of the shards its
        # first epoch reads first (one round trip fewer before its first batch)
        first = partial(shard_order, seed=as_int("seed", seed), epoch=0, shuffle=bool(shuffle))
        plain = self.node.node_size is None and self.filter is None and self.split is None
        self.index = shared_index(
            source, self.storage_options, self.retry, first if plain else None
        )
        check_decode(decode, allow_pickle, [self.index.format])
        if pack is not None and self.index.format == "tar":
            raise ValueError(
                "pack= reads a token column of Parquet or Arrow IPC shards; these are tar "
                "shards (README: 'Pretraining on tokens' writes such a column)"
            )
        # Parquet: the asked columns as every shard gives them (errors name the shard)
        self.schema = (
            None if self.index.format == "tar" else self.index.columns_schema(self.columns)
        )
        if self.index.format == "tar":
            check_tar_columns(self.index.shards, self.columns)
        self.kinds = (
            kinds_of(self.schema, fill_nulls, pad)
            if self.schema is not None and self.batch_size is not None and pack is None
            else None
        )
        if self.kinds is not None and self.batch_format != "torch":
            self.kinds = arrow_kinds(self.schema)  # gathered as Arrow, made a RecordBatch
        # the records: all of the index's, or those `filter` and `split` select
        # (loader.selection); what the sampler plans over and the reader reads
        self.view = select(
            self.index,
            self._make_format(self.index, None, None),
            self.filter,
            self.split,
            as_int("seed", seed),
            self.storage_options,
            self.retry,
        )
        if pack is not None and self.schema is not None:
            check_token_column(self.schema, pack)
            self.kinds = {pack.column: Kind(False)}  # handed to the packer as Arrow lists
        # where each shard's read groups lie: the reading order shuffles group by group
        self.groups = ShardGroups(self.view.shards, self._format().groups)
        self.sampler = ShardSampler(
            self.view,
            topo.world_size,
            topo.rank,
            shuffle,
            seed,
            drop_last,
            window,
            self.groups,
            self.node.node_size,
        )
        self.packing = (
            None
            if pack is None
            else Packing(pack, self.view, self._format(), self.storage_options, topo.world_size)
        )
        self.packings = [] if self.packing is None else [self.packing]
        self._start_epochs()

    def _adopt(self, topo: Topology) -> None:
        self.node = NodeOptions.check(*self._node_args, topo.world_size)
        if self.packing is not None:
            self.packing.check_ranks(topo.world_size)
        self.sampler = self._sampler_for(topo.world_size, topo.rank, self.node.node_size)

    def _layout(self, num_workers: int) -> Layout:
        if self.packing is not None:  # items count blocks of the epoch's token line
            return Layout(
                self.sampler.num_replicas,
                num_workers,
                self.batch_size or 0,
                self.packing.blocks,
                True,
            )
        return Layout(
            self.sampler.num_replicas,
            num_workers,
            self.batch_size or 0,
            self.sampler.num_records,
            self.sampler.drop_last,
            self.node.node_size or 0,
        )

    def _format(self) -> Format:
        return self._make_format(self.view, self.schema, self.kinds)

    def __iter__(self) -> Iterator[Any]:
        self._settle()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        layout = self._layout(workers)
        segments, skip, self._role = self._worker_part(layout, worker)
        self._cursor.reset(skip)
        records = sum(b - a for *_, a, b in segments)
        start = min(records, skip * layout.item)
        fmt = self._format()
        if self.packing is not None:
            fmt = self.packing.token_format(fmt)
        root = layout.root(layout.base_of(self._resume, self.epoch))
        stats = self._stats.mine(0 if info is None else 1 + worker)
        reader = PlanReader(
            self.view,
            fmt,
            columns=self.columns,
            storage_options=self.storage_options,
            retry=self.retry,
            read_threads=self.read_threads,
            prefetch=self.prefetch,
            memory_budget=self.memory_budget // max(1, workers),
            stats=stats,
            cache=self.node.cache(
                # packing reads blocks, not the record plan: its cache evicts the least
                # recently read (loader.cache.locality)
                None if self.packing else self.sampler,
                self._name_of,
                worker,
                workers,
            ),
        )
        if self.packing is not None:
            runs_of_blocks = self.packing.runs(
                self.sampler,
                self.epoch,
                cut_segments(segments, start, records),
                root.length,
                root.num_workers,
                root.item,
            )
            blocks = self.packing.blocks_of(reader, runs_of_blocks)
            packed = items(blocks, self.packing.pack.column, self.batch_size)
            return self._hand_out(packed, stats, info is not None, worker, records, layout.item)
        runs = [
            (self._plan(root, rank, worker), a, b)
            for rank, worker, a, b in cut_segments(segments, start, records)
        ]
        if self.sampler.rank == 0 and worker == 0 and self._state.once():
            self._warn_amplified(workers)
        # (records of Parquet and Arrow: a slab of tar samples holds their bytes)
        slab = RECORD_SLAB if not self.batch_size and isinstance(fmt, ParquetFormat) else SLAB
        taken = reader.parts(runs, self.batch_size or RECORD_STEP, slab=slab)
        if self.batch_size is None:
            deliveries: Iterator[Any] = (fmt.records(part) for part in taken)
        elif self.batch_format != "torch" and self.kinds is not None:
            arrow = arrow_batches(taken, self.batch_size, self.schema)
            deliveries = ([shaped(b, self.batch_format)] for b in arrow)
        else:
            batches = regroup((fmt.batch(part) for part in taken), self.batch_size, self.pad)
            if self.batch_format != "torch":  # tar samples' batches: from their lists
                batches = (shaped(b, self.batch_format) for b in batches)
            deliveries = ([b] for b in batches)
        return self._hand_out(deliveries, stats, info is not None, worker, records, layout.item)

    def _warn_amplified(self, workers: int) -> None:
        """One WARNING a job (from rank 0) when any reader of any rank fetches much more
        than its records' bytes (loader.read.amplification)."""
        worst = job_amplification(self.view, self.sampler, workers, self.batch_size or 1)
        if worst is not None and worst[0] > AMPLIFICATION_LIMIT:
            log.warning(warning_text(worst, self.sampler.num_replicas, workers))

    def _name_of(self, shard: int) -> tuple[str, str | None]:
        """(url, version) of a shard: what its node cache blocks are named by."""
        entry = self.view.shards[shard]
        return entry.url, entry.version

    def _plan(self, root: Layout, rank: int, worker: int) -> Plan:
        """Plan `worker` of `rank` in the layout the epoch started with."""
        sampler = self._sampler_for(root.num_replicas, rank, root.local_world_size or None)
        sampler.set_epoch(self.epoch)
        return sampler.plan(worker, max(1, root.num_workers), align=root.item)

    def _sampler_for(self, num_replicas: int, rank: int, node_size: int | None) -> ShardSampler:
        """This dataset's sampler (shards, seed, shuffle, ...) for `rank` of `num_replicas`."""
        mine = self.sampler
        return ShardSampler(
            mine.sizes,
            num_replicas,
            rank,
            mine.shuffle,
            mine.seed,
            mine.drop_last,
            mine.window,
            self.groups,
            node_size,
        )


StreamingDataset.register(MixtureDataset)  # isinstance(a mixture, StreamingDataset) holds
StreamingDataset.__signature__ = init_signature(StreamingDataset)
