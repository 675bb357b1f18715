"""A dataset's packing: its documents' token counts, the epoch's blocks, and the blocks
each worker reads (sampler.packing locates them; loader.tokens.packer makes them)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shardstream.sampler.epoch import worker_span
from shardstream.sampler.packing import PackLine, PackRun, blocks_per_rank, dropped, shard_tokens
from shardstream.sampler.resume import Segment

from ..formats import Format
from ..index.shard_index import ShardIndex
from ..read.plan_reader import PlanReader
from ..storage.filesystems import redact
from .lengths import document_lengths
from .pack import Pack
from .packer import Blocks, pack_run
from .rows import TokenFormat

__all__ = ["PART_DOCUMENTS", "Packing"]

PART_DOCUMENTS = 256  # documents the reader hands the packer at a time


class Packing:
    """`pack` over `index`: each document's places (tokens and separators) from the
    index's token counts (counted once if it has none, loader.tokens.lengths), the
    epoch's T places and ``T // length`` blocks. ValueError when a rank would make no
    block."""

    def __init__(
        self,
        pack: Pack,
        index: ShardIndex,
        fmt: Format,
        storage_options: dict[str, Any] | None,
        num_replicas: int,
    ) -> None:
        self.pack = pack
        self.index = index
        self.places = pack.places(document_lengths(index, fmt, pack.column, storage_options))
        self.sizes = index.shard_sizes
        self.per_shard = shard_tokens(self.sizes, self.places)  # once: lines cost O(shards)
        self.total = int(self.per_shard.sum())
        self.blocks = self.total // pack.length
        self.check_ranks(num_replicas)

    def check_ranks(self, num_replicas: int) -> None:
        """ValueError when a rank of `num_replicas` would make no block."""
        if blocks_per_rank(self.total, self.pack.length, num_replicas) < 1:
            raise ValueError(
                f"the data holds {self.total} tokens (separators included) in "
                f"{self.places.size} documents: {self.blocks} blocks of {self.pack.length}, "
                f"fewer than one for each of {num_replicas} ranks"
            )

    def summary(self, num_replicas: int) -> dict[str, int]:
        """Tokens an epoch, blocks each rank makes, and tokens no block holds."""
        return {
            "tokens": self.total,
            "documents": int(self.places.size),
            "blocks_per_rank": blocks_per_rank(self.total, self.pack.length, num_replicas),
            "tokens_dropped": dropped(self.total, self.pack.length, num_replicas),
        }

    def line(self, seed: int, epoch: int, shuffle: bool, window: int, groups: Any) -> PackLine:
        """The token line of `epoch` (a mixture's stream: of a pass) for these documents."""
        return PackLine(
            self.sizes,
            self.places,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            window=window,
            groups=groups,
            per_shard=self.per_shard,
        )

    def runs(
        self,
        sampler: Any,
        epoch: int,
        segments: Iterable[Segment],
        rank_blocks: int,
        num_workers: int,
        item: int,
    ) -> list[PackRun]:
        """The runs of `segments` (rank, worker, a, b: blocks [a, b) of that worker's part
        in the layout the epoch started in, of `rank_blocks` blocks a rank, `num_workers`
        workers, cut at multiples of `item`), in order. `sampler`: the dataset's
        ShardSampler (seed, shuffle, window, groups)."""
        line = self.line(sampler.seed, epoch, sampler.shuffle, sampler.window, sampler.groups)
        out = []
        for rank, worker, a, b in segments:
            lo, _ = worker_span(rank, rank_blocks, worker, max(1, num_workers), item)
            run = line.run(lo + a, lo + b, self.pack.length)
            if run is not None:
                out.append(run)
        return out

    def token_format(self, fmt: Format) -> TokenFormat:
        """The dataset's format, handing the pack column's documents over as numpy
        (loader.tokens.rows): what the reader of `blocks_of` reads with."""
        return TokenFormat(fmt, self.pack.column)

    def blocks_of(self, reader: PlanReader, runs: Iterable[PackRun]) -> Iterator[Blocks]:
        """The runs' blocks, read by `reader` (made with `token_format`), a few at a
        time."""
        for run in runs:
            parts = reader.parts([(run.plan, run.start, run.stop)], PART_DOCUMENTS)
            yield from pack_run(parts, self.pack, run, self._where(run))

    def _where(self, run: PackRun) -> str:
        """The run's blocks and shards, for errors."""
        shards = sorted({int(s) for s in run.plan.shards})
        urls = [redact(self.index.shards[s].url) for s in shards[:3]]
        more = f" and {len(shards) - 3} more" if len(shards) > 3 else ""
        last = run.first_block + run.blocks - 1
        return f"blocks {run.first_block}..{last} (shards {', '.join(urls)}{more})"
