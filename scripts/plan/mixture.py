"""Planning a mixture for shardstream-plan: per stream, what an epoch takes of it; per rank,
records, shards and bytes.

    --stream NAME=SOURCE[:WEIGHT]    repeatable; SOURCE as for one dataset, or
                                     simulate:SHARDSxRECORDS (synthetic, no storage)
    --epoch-size E                   records an epoch over all ranks (default: all streams)
    --phase ITEMS:NAME=W,...         repeatable: a schedule's phases, in order
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

if TYPE_CHECKING:  # torch is imported only when a mixture is planned
    from shardstream.loader.index.shard_index import ShardIndex
    from shardstream.sampler.mixture.sampler import MixtureSampler

__all__ = ["StreamArg", "mixture_doc", "parse_phase", "parse_stream"]

SIMULATE = "simulate:"


@dataclass(frozen=True)
class StreamArg:
    """One --stream: a name, a source (or a simulated shape) and a weight."""

    name: str
    source: str
    weight: float | None

    @property
    def simulated(self) -> tuple[int, int] | None:
        """(shards, records per shard) of a simulate:SxN source."""
        if not self.source.startswith(SIMULATE):
            return None
        shards, _, records = self.source[len(SIMULATE) :].partition("x")
        try:
            s, n = int(shards), int(records)
        except ValueError:
            raise ValueError(
                f"--stream {self.name}: {self.source!r} is not simulate:SHARDSxRECORDS"
            ) from None
        if s < 1 or n < 1:
            raise ValueError(f"--stream {self.name}: simulate needs positive sizes")
        return s, n


def parse_stream(text: str) -> StreamArg:
    """NAME=SOURCE[:WEIGHT] (the weight is what follows the last colon, when a number)."""
    name, eq, rest = text.partition("=")
    if not eq or not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE[:WEIGHT], got {text!r}")
    source, _, last = rest.rpartition(":")
    try:
        weight = float(last)
    except ValueError:
        return StreamArg(name, rest, None)
    if not source:
        raise argparse.ArgumentTypeError(f"--stream {name}: no SOURCE before :{last}")
    if not math.isfinite(weight) or weight <= 0:
        raise argparse.ArgumentTypeError(f"--stream {name}: weight must be > 0, got {last}")
    return StreamArg(name, source, weight)


def parse_phase(text: str) -> tuple[int, dict[str, float]]:
    """ITEMS:NAME=W,NAME=W,... -> (items, {name: weight})."""
    items, colon, rest = text.partition(":")
    try:
        if not colon:
            raise ValueError(text)
        weights = {n: float(w) for n, _, w in (p.partition("=") for p in rest.split(","))}
        return int(items), weights
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected ITEMS:NAME=WEIGHT,..., got {text!r}")


def _sizes(arg: StreamArg, index: ShardIndex | None) -> Any:
    shape = arg.simulated
    if shape is not None:
        return np.full(shape[0], shape[1], dtype=np.int64)
    assert index is not None
    return index.shard_sizes


def mixture_doc(
    args: argparse.Namespace, indexes: list[ShardIndex | None], horizon: int = 20
) -> dict[str, Any]:
    """The plan of a mixture as JSON-ready data: streams (records per rank and epoch,
    passes per epoch, the epoch at which the current pass ends, and when the next passes
    end within `horizon` epochs), ranks (records, shards, bytes per stream)."""
    streams: list[StreamArg] = args.stream
    sizes = [_sizes(a, i) for a, i in zip(streams, indexes)]
    weights = [a.weight if a.weight is not None else int(s.sum()) for a, s in zip(streams, sizes)]
    schedule = args.phase or None

    from shardstream.sampler.mixture.sampler import MixtureSampler

    def sampler(rank: int) -> MixtureSampler:
        m = MixtureSampler(
            sizes,
            None if schedule else weights,
            args.epoch_size,
            args.world_size,
            rank,
            not args.no_shuffle,
            args.seed,
            args.drop_last,
            names=[a.name for a in streams],
            schedule=schedule,
        )
        m.set_epoch(args.epoch)
        return m

    first = sampler(0)
    cursors, counts = first.epoch_start()
    spans = first.pass_lengths
    out_streams = []
    for k, a in enumerate(streams):
        left = spans[k] - cursors[k].consumed  # of the current pass, per rank
        ends = _pass_ends(args.epoch, left, spans[k], counts[k], horizon)
        out_streams.append(
            {
                "name": a.name,
                "source": a.source,
                "weight": None if schedule else weights[k],
                "num_shards": int(sizes[k].size),
                "num_records": int(sizes[k].sum()),
                "records_per_rank": counts[k],
                "pass_records_per_rank": spans[k],
                "passes_per_epoch": counts[k] / spans[k],
                "pass": cursors[k].pass_index,
                "pass_ends_epoch": ends[0] if ends else None,
                "pass_ends": ends,
            }
        )
    rows = _rank_rows(args, sampler, indexes, len(streams))
    return {
        "streams": out_streams,
        "epoch_size": first.epoch_size,
        "num_records": sum(s["num_records"] for s in out_streams),
        "num_shards": sum(s["num_shards"] for s in out_streams),
        "world_size": args.world_size,
        "workers": args.workers,
        "seed": args.seed,
        "epoch": args.epoch,
        "drop_last": args.drop_last,
        "balance": 1.0,  # every rank reads E // R positions
        "mixing": None,
        "phases": [
            {"items": int(items), "per_rank": n, "records_per_stream": list(counts)}
            for items, n, counts in zip(
                first.phase_items, first.phases.lengths, first.phases.counts
            )
        ],
        "per_rank": rows,
    }


def _pass_ends(epoch: int, left: int, span: int, count: int, horizon: int) -> list[int]:
    """Epochs (from `epoch`, within `horizon`) during which a pass of the stream ends: the
    current one after `left` more records, then one every `span` records, at `count`
    records an epoch."""
    ends, need = [], left
    while count and need <= count * horizon:
        ends.append(epoch + (need - 1) // count)
        need += span
    return ends


def _rank_rows(
    args: argparse.Namespace, sampler: Any, indexes: list[ShardIndex | None], streams: int
) -> list[dict[str, Any]]:
    rows = []
    for rank in tqdm(range(args.world_size), desc="planning", disable=args.json):
        m = sampler(rank)
        shards: set[tuple[int, int]] = set()
        per_stream = [0] * streams
        parts = [
            m.part(lo, hi)
            for w in range(args.workers)
            for lo, hi in m.worker_ranges(w, args.workers)
        ]
        for part in parts:
            for k, pieces in enumerate(part.pieces):
                for piece in pieces:
                    plan = piece.plan
                    if piece.start >= piece.stop:
                        continue
                    blocks = plan.blocks()
                    first, last = plan.block_at(piece.start), plan.block_at(piece.stop - 1)
                    for b0, b1 in blocks[first : last + 1]:
                        for p in range(b0, b1):
                            shards.add((k, int(plan.shards[p])))
                            idx = indexes[k]
                            if idx is not None:
                                per_stream[k] += idx.bytes_for(
                                    int(plan.shards[p]), int(plan.starts[p]), int(plan.stops[p])
                                )
        simulated = all(i is None for i in indexes)
        rows.append(
            {
                "rank": rank,
                "records": len(m),
                "shards": len(shards),
                "bytes": None if simulated else sum(per_stream),
                "bytes_per_stream": None if simulated else per_stream,
                "records_per_stream": list(m.epoch_counts()),
            }
        )
    return rows
