"""StreamingDataset: the IterableDataset that reads only this rank's and worker's records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import get_worker_info

from sampler import DEFAULT_WINDOW, ShardSampler, Topology
from sampler.checks import IntLike
from sampler.plan import Plan
from sampler.resume import cut_segments

from .base import RECORD_STEP, DatasetBase, init_signature
from .cache.locality import NodeOptions
from .columns.batching import regroup
from .columns.kinds import Kind, kinds_of
from .formats import Format
from .formats.tar import check_tar_columns
from .formats.tar_decode import DecodeSpec
from .index.distributed import shared_index
from .index.shard_index import ShardIndex
from .index.table import ShardGroups
from .mixture import MixtureDataset
from .options import Transform, check_batch_options, check_decode
from .read.amplification import LIMIT as AMPLIFICATION_LIMIT
from .read.amplification import job_amplification, log, warning_text
from .read.plan_reader import PlanReader
from .state import Layout
from .storage.filesystems import UrlOrPath
from .storage.retry import RetryPolicy
from .streams import Stream, is_mixture
from .tokens.pack import Pack, check_token_column, pack_columns
from .tokens.packer import items
from .tokens.packing import Packing

__all__ = ["StreamingDataset"]

# one source: a folder, prefix, glob, URL or list of them, a manifest, a saved index, a
# ShardIndex (or a datasets.Dataset, loader.index.hf)
Source = UrlOrPath | Sequence[UrlOrPath] | ShardIndex


class StreamingDataset(DatasetBase):
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
    here: an unknown spec raises ValueError listing webdataset's; on Parquet or Arrow
    shards `decode` is refused: decode their bytes in `transform`). A shard cannot run code:
    pickled members (``.pyd``, ``.pkl``, ``.pickle``) are a ShardError naming the shard,
    sample and field unless `allow_pickle` is True, and ``.pth`` members load with
    ``torch.load(weights_only=True)`` unless it is (``.npy``/``.npz`` never unpickle).
    With `batch_size` B it
    yields batches instead (use ``DataLoader(ds, batch_size=None)``): numeric and fixed-length
    list columns as tensors, others as lists; only the rank's last batch may be short.
    A column's kind is decided once, from the schema (loader.columns.kinds): nulls in float
    columns become NaN, in integer columns an error unless `fill_nulls` gives a value
    (``{"label": -1}``); plain list columns whose rows differ in length are an error unless
    `pad` gives a pad value (``{"tokens": 0}``: rows padded to each batch's longest, their
    lengths beside them as ``tokens__len``). A batch is a `loader.Batch` (a dict); a
    DataLoader batching batches (its own batch_size) raises TypeError with the fix.
    `transform` (a function) maps each record, or each batch, where it is made (inside
    DataLoader workers); it returns one item for one, so `len` and resume hold (a batch
    whose row count it changes is a ValueError).
    `columns` selects Parquet columns (Hive partition keys included) or tar extensions:
    one name (a str) or a list of them (an extension no indexed sample has: ValueError).
    `source` may also name shards with webdataset's braces (``shard-{000..099}.tar``) or
    be a ``datasets.Dataset`` (its Arrow files, loader.index.hf).

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

    Pretraining on tokens: ``pack=Pack("input_ids", length=2049, eos=2)`` (loader.tokens)
    yields fixed-length blocks of the documents of that column (a list of integer token
    ids a row) laid end to end in the epoch's order instead of records: dicts of int64
    tensors of `length` (the column, ``position_ids``, ``document_ids``), or batches of
    them with `batch_size`. Every rank makes ``(T // length) // num_replicas`` blocks an
    epoch (T: the epoch's tokens, separators included), `len` says so before reading, no
    token is in two blocks of an epoch, and `stats()["pack"]` counts what no block holds.
    The documents' token counts come from the index (``ds.index.save`` keeps them), or
    are read once from the shards' token column. Resume, elastic resume, DataLoader
    workers and `transform` (on blocks or batches) work as for records; `drop_last` does
    not apply (counts are equal anyway); `columns`, `pad`, `fill_nulls` and `locality`
    are refused, and so are tar shards. With a list of Stream, weights count tokens
    (loader.tokens.mixing).

    Several epochs from remote storage: `cache_dir` (a local folder the ranks of a node
    share) keeps the remote bytes read, so a later epoch reads them from disk;
    `cache_limit` (bytes, or "50GB") bounds it, evicting by the plan's next use
    (loader.cache.node). ``locality="node"`` keeps each node's records the same every epoch
    (reshuffled inside the node), so the cache holds what the node reads next; nodes are
    `local_world_size` consecutive ranks (default: torchrun's LOCAL_WORLD_SIZE).

    Integer arguments (seed, ranks, batch_size, window, read_threads, memory_budget) take
    Python ints or numpy integers, as torch does; bools, floats and other types raise
    ValueError.

    `set_epoch` reaches workers started earlier (``persistent_workers=True``): the epoch
    lives in a shared-memory tensor (loader.epoch), which also lets a second full pass
    over one epoch without `set_epoch` warn once.
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
        topo = self._topology(num_replicas, rank)
        self._node_args = (cache_dir, cache_limit, locality, local_world_size)
        self.node = NodeOptions.check(*self._node_args, topo.world_size)
        self.storage_options = dict(storage_options or {})
        if pack is not None:
            self.columns = pack_columns(pack, self.columns, fill_nulls, pad, locality)
        if pack is None:
            check_batch_options(self.batch_size, fill_nulls, pad)
        self.index = shared_index(source, self.storage_options, self.retry)
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
        if pack is not None and self.schema is not None:
            check_token_column(self.schema, pack)
            self.kinds = {pack.column: Kind(False)}  # handed to the packer as Arrow lists
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
        self.packing = (
            None
            if pack is None
            else Packing(pack, self.index, self._format(), self.storage_options, topo.world_size)
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
        return self._make_format(self.index, self.schema, self.kinds)

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
            self.index,
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
        taken = reader.parts(runs, self.batch_size or RECORD_STEP)
        if self.batch_size is None:
            deliveries: Iterator[Any] = (fmt.records(part) for part in taken)
        else:
            batches = regroup((fmt.batch(part) for part in taken), self.batch_size, self.pad)
            deliveries = ([b] for b in batches)
        return self._hand_out(deliveries, stats, info is not None, worker, records, layout.item)

    def _warn_amplified(self, workers: int) -> None:
        """One WARNING a job (from rank 0) when any reader of any rank fetches much more
        than its records' bytes (loader.read.amplification)."""
        worst = job_amplification(self.index, self.sampler, workers, self.batch_size or 1)
        if worst is not None and worst[0] > AMPLIFICATION_LIMIT:
            log.warning(warning_text(worst, self.sampler.num_replicas, workers))

    def _name_of(self, shard: int) -> tuple[str, str | None]:
        """(url, version) of a shard: what its node cache blocks are named by."""
        entry = self.index.shards[shard]
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
