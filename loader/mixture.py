"""Mixtures: several sources with weights, read as one StreamingDataset.

    StreamingDataset([Stream("s3://b/web/", weight=0.7), Stream("data/code/", weight=0.3)],
                     epoch_size=1_000_000, batch_size=1024)

`sampler.MixtureSampler` plans it: every rank reads L = epoch_size // num_replicas records
an epoch, c_k of them from stream k (largest remainder by the weights), placed by a
stratified schedule so that every batch holds the mix; stream k is read as whole passes of
its own, one after the other. This module reads that plan: each stream through its own
PlanReader (its index, storage options, readers and threads, so a slow stream never holds
up another's reads), the streams' records merged in the schedule's order.

Workers split a rank's positions into contiguous, batch-aligned parts, so a worker reads
its own contiguous part of each stream's pass. Resume and elastic resume reuse the
single-source machinery (loader.state): a worker's positions are a "segment", and the rest
of an epoch resumed in another layout is those segments cut anew. The state adds, per
stream, the cursor at the epoch's start (`MixtureSampler.state_dict()["streams"]`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from torch.utils.data import get_worker_info

from shardstream.sampler import DEFAULT_WINDOW, MixtureSampler
from shardstream.sampler.checks import IntLike, as_int
from shardstream.sampler.epoch import shard_order
from shardstream.sampler.mixture import stream_seed
from shardstream.sampler.resume import Segment, cut_segments

from .base import RECORD_STEP, init_signature
from .columns.batch_format import check_batch_format
from .columns.batching import regroup
from .formats import Format
from .formats.tar.decode import DecodeSpec
from .formats.tar.format import check_tar_columns
from .index.shared import shared_indexes
from .index.table import ShardGroups
from .mixture_epochs import MixtureEpochs
from .options import Transform, check_batch_options, check_decode
from .read.mixture_rows import STREAM, mixed_parts
from .read.plan_reader import SLAB, MemoryBudget, PlanReader, decoding_pool, is_local
from .read.readahead import reading_pool
from .selection import select
from .state import Layout
from .storage.retry import RetryPolicy
from .streams import (
    Schedule,
    Stream,
    check_formats,
    check_kinds,
    check_stream_column,
    is_mixture,
    stream_name,
)
from .tokens.mixing import Lines, mixed_blocks, pseudo_sizes
from .tokens.pack import Pack, pack_columns, token_kinds
from .tokens.packer import items
from .tokens.packing import Packing

__all__ = ["MixtureDataset"]


class MixtureDataset(MixtureEpochs):
    """A StreamingDataset over several Streams (see the module docstring, and README,
    "Mixing sources"). `StreamingDataset([Stream, ...], ...)` makes one.

    Records carry ``"__stream__"`` (the stream's name); batches carry ``"__stream__"`` as
    an int64 tensor of stream indices. In batch mode every stream must have the asked
    columns with one kind each (checked here); streams of different formats mix in record
    mode only. `len()`, `set_epoch`, workers, `state_dict` / `consumed_state` /
    `load_state_dict` (also into another number of ranks or workers) work as for one
    source. `schedule=` gives the epoch phases with weights of their own; a rank's state
    loaded under another schedule or weights goes on under them from its next item
    (sampler.mixture.reweight).
    """

    def __init__(
        self,
        streams: Sequence[Stream],
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
        cache_dir: Any = None,
        cache_limit: int | str | None = None,
        locality: str | None = None,
        local_world_size: IntLike | None = None,
        pack: Pack | None = None,
        batch_format: str = "torch",
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__()
        if not is_mixture(streams):
            raise ValueError(f"a mixture needs a non-empty list of Stream, got {streams!r}")
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
        if pack is not None:
            self.columns = pack_columns(pack, self.columns, fill_nulls, pad, locality)
        topo = self._topology(num_replicas, rank)
        self.streams = list(streams)
        self._node_args = (cache_dir, cache_limit, locality, local_world_size)
        self._check_nodes(topo.world_size)
        self.names = [stream_name(s, k) for k, s in enumerate(self.streams)]
        dupes = sorted({n for n in self.names if self.names.count(n) > 1})
        if dupes:
            raise ValueError(f"stream names must be unique; repeated: {dupes} (pass name=...)")
        self.options = [
            dict(s.storage_options if s.storage_options is not None else storage_options or {})
            for s in self.streams
        ]
        if pack is None:
            check_batch_options(self.batch_size, fill_nulls, pad)
        if check_batch_format(batch_format, self.batch_size, pack) != "torch":
            raise ValueError(f"batch_format={batch_format!r}: a mixture's batches are torch's")
        # built by the ranks (no saved index): each scans the footers of the shards its
        # first pass of each stream reads first (a stream's pass is a ShardSampler epoch)
        plain, on = pack is None and local_world_size is None, bool(shuffle)
        first = [
            partial(shard_order, seed=stream_seed(as_int("seed", seed), n), epoch=0, shuffle=on)
            if plain and s.filter is None and s.split is None
            else None
            for s, n in zip(self.streams, self.names)
        ]
        self.sources = shared_indexes([s.source for s in streams], self.options, self.retry, first)
        self.indexes = [  # each stream's records: all, or those its filter and split select
            select(i, self._make_format(i, None, None), s.filter, s.split, int(seed), o, self.retry)
            for s, i, o in zip(self.streams, self.sources, self.options)
        ]
        check_decode(decode, allow_pickle, [i.format for i in self.indexes])
        check_formats(
            self.names, [i.format for i in self.indexes], self.batch_size if pack is None else 1
        )
        for idx in self.indexes:
            if idx.format == "tar":
                check_tar_columns(idx.shards, self.columns)
        self.schemas = [
            None if idx.format == "tar" else idx.columns_schema(self.columns)
            for idx in self.indexes
        ]
        check_stream_column(self.names, self.schemas, STREAM)
        self.kinds_per_stream = (
            token_kinds(pack, self.schemas)
            if pack is not None
            else check_kinds(self.names, self.schemas, fill_nulls, self.pad)
            if self.batch_size is not None
            else [None] * len(self.streams)
        )
        self._lengths: dict[str, int] = {}  # ragged list columns' length, shared by streams
        # per stream, where each shard's read groups lie (the reading order shuffles by them)
        groups = [
            ShardGroups(idx.shards, self._format_of(k).groups) for k, idx in enumerate(self.indexes)
        ]
        # packing: each stream's blocks are its records (loader.tokens.mixing)
        self.packings = [
            Packing(pack, idx, self._format_of(k), o, topo.world_size)
            for k, (idx, o) in enumerate(zip(self.indexes, self.options))
            if pack is not None
        ]
        self._lines = Lines(self.packings, groups, shuffle, int(window))
        weighed = [n for n, s in zip(self.names, self.streams) if s.weight is not None]
        if schedule is not None and weighed:
            raise ValueError(
                f"schedule= gives the weights; Stream(weight=...) of {weighed} conflicts"
            )
        weights = [
            s.weight
            if s.weight is not None
            else self.packings[k].total
            if pack is not None
            else idx.num_records
            for k, (s, idx) in enumerate(zip(self.streams, self.indexes))
        ]
        self.sampler = MixtureSampler(
            pseudo_sizes(self.packings) if pack is not None else self.indexes,
            weights if schedule is None else None,
            epoch_size,
            topo.world_size,
            topo.rank,
            shuffle and pack is None,  # a pass's blocks are read in order
            seed,
            drop_last or pack is not None,  # no block twice in a pass
            window,
            self.names,
            None if pack is not None else groups,
            self.node.node_size,
            schedule,
        )
        self._start_epochs()

    # --- reading ------------------------------------------------------------------------

    def _format_of(self, k: int) -> Format:
        return self._make_format(
            self.indexes[k], self.schemas[k], self.kinds_per_stream[k], self._lengths
        )

    def __iter__(self) -> Iterator[Any]:
        self._settle()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        layout = self._layout(workers)
        epoch = self.epoch
        segments, skip, self._role = self._worker_part(layout, worker)
        self._cursor.reset(skip)
        total = sum(b - a for *_, a, b in segments)
        start = min(total, skip * layout.item)
        root = layout.root(layout.base_of(self._resume, epoch))
        # batch mode merges a slab of whole batches at once (3 streams: 1.97 -> 1.61 us/record)
        step = self.batch_size * max(1, SLAB // self.batch_size) if self.batch_size else RECORD_STEP
        stats = self._stats.mine(0 if info is None else 1 + worker)
        # one budget for all streams: they are read together, and held together
        budget = MemoryBudget(self.memory_budget // max(1, workers))
        # and one decoding pool: the streams' groups are decoded on the cores one stream
        # would use (a pool each ran 3 decoding threads on 2 cores; measured slower)
        decoders = decoding_pool(all(is_local(i, o) for i, o in zip(self.indexes, self.options)))
        pools = (decoders, reading_pool())  # and one reading thread (readahead.reading_pool)
        readers = [
            PlanReader(
                idx,
                self._format_of(k)
                if not self.packings
                else self.packings[k].token_format(self._format_of(k)),
                columns=self.columns,
                storage_options=opts,
                retry=self.retry,
                read_threads=self.read_threads,
                prefetch=self.prefetch,
                memory_budget=budget,
                stats=stats,
                decoders=decoders,
                readers=pools[1],
                cache=self.nodes[k].cache(None, None, worker, workers),
            )
            for k, (idx, opts) in enumerate(zip(self.indexes, self.options))
        ]
        cut = cut_segments(segments, start, total)
        if self.packings:
            return self._hand_out(
                self._packed(cut, root, epoch, readers, pools),
                stats,
                info is not None,
                worker,
                total,
                layout.item,
            )
        chunks = mixed_parts(
            cut,
            lambda replicas, rank: self._sampler_for(replicas, rank, epoch),
            root,
            readers,
            self.names,
            (step, self.batch_size or 0),
            pools,
        )
        deliveries: Iterator[Any] = (
            chunks  # lists of records
            if self.batch_size is None
            else ([b] for b in regroup(chunks, self.batch_size, self.pad))
        )
        return self._hand_out(deliveries, stats, info is not None, worker, total, layout.item)

    def _packed(
        self,
        segments: list[Segment],
        root: Layout,
        epoch: int,
        readers: list[PlanReader],
        pools: Sequence[ThreadPoolExecutor],
    ) -> Iterator[Any]:
        """With pack: the segments' blocks mixed by the schedule, as items (lists)."""
        try:
            blocks = mixed_blocks(
                segments,
                lambda replicas, rank: self._sampler_for(replicas, rank, epoch),
                root,
                self._lines,
                readers,
                self.names,
                self.batch_size or RECORD_STEP // 16,
            )
            yield from items(blocks, self.packings[0].pack.column, self.batch_size)
        finally:
            for pool in pools:
                pool.shutdown(wait=True)


MixtureDataset.__signature__ = init_signature(MixtureDataset)
