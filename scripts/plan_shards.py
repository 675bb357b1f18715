"""Show how a sharded dataset splits over a job's ranks, and save its index.

    plan_shards.py SOURCE [--world-size R] [--workers W] [--seed S] [--epoch E] [--drop-last]
                   [--save-index PATH] [--json] [--plot PNG] [--storage-options JSON]
                   [--index-workers N] [--write-sidecars] [--no-sidecars]
    plan_shards.py --simulate-shards S [--records-per-shard N] --world-size R [--rank K] ...
    plan_shards.py --stream NAME=SOURCE[:WEIGHT] [--stream ...] [--epoch-size E] --world-size R
    plan_shards.py SOURCE --pack-column COL --pack-length L [--eos ID] [--bos ID] --world-size R

Indexes SOURCE (a directory, s3:// prefix, glob or saved index; S3 credentials and endpoint
from the standard AWS variables such as AWS_ENDPOINT_URL, or --storage-options), then prints
one row per rank: records, shards touched, bytes to read (the row groups or tar ranges that
hold its records), with the balance (max/min) and the mixing metric (mean distinct shards in
a batch of 64 consecutive records) of a sample of ranks. --simulate-shards plans a synthetic
dataset of equal shards (1,000 records each unless --records-per-shard) without touching
storage. --rank K prints one rank's plan only (its pieces: shard, rows, bytes), computed
without planning the others: O(shards) at any world size. --stream plans a mixture (see
scripts/plan_mixture.py): per stream, records per rank and epoch, passes per epoch and the
epoch at which its current pass ends; SOURCE may be simulate:SHARDSxRECORDS.
--pack-length (scripts/plan_pack.py) prints the blocks of tokens every rank makes and the
tokens dropped an epoch; --simulate-shards with it takes --tokens-per-document.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from loader.errors import ShardError
from sampler.checks import parse_size
from sampler.epoch import epoch_line, rank_length
from sampler.mixing import distinct_per_batch
from sampler.planning import all_plans

# torch-free imports only: a simulated plan never imports torch (2.5 s of the command
# otherwise); indexing a SOURCE imports the loader (and torch) when it is asked for
try:  # run as scripts/plan_shards.py, or installed as shardstream_scripts.plan_shards
    from plan_cache import DEFAULT_SIM_NODES, cache_doc, print_cache
    from plan_load import load_index, load_streams, storage_options
    from plan_mixture import mixture_doc, parse_stream
    from plan_pack import add_pack_arguments, check_pack_arguments, pack_doc, print_pack
    from plan_plot import plot, plot_cache
    from plan_rank import print_rank, rank_doc, settings, sizes_of
except ImportError:
    from shardstream_scripts.plan_cache import DEFAULT_SIM_NODES, cache_doc, print_cache
    from shardstream_scripts.plan_load import load_index, load_streams, storage_options
    from shardstream_scripts.plan_mixture import mixture_doc, parse_stream
    from shardstream_scripts.plan_pack import (
        add_pack_arguments,
        check_pack_arguments,
        pack_doc,
        print_pack,
    )
    from shardstream_scripts.plan_plot import plot, plot_cache
    from shardstream_scripts.plan_rank import print_rank, rank_doc, settings, sizes_of

if TYPE_CHECKING:
    from loader.index.shard_index import ShardIndex


MIXING_RANKS = 4  # ranks sampled for the mixing metric
MIXING_RECORDS = 1 << 16  # records of each sampled rank it looks at


@dataclass
class RankRow:
    rank: int
    records: int
    shards: int
    bytes: int | None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="shardstream-plan", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("source", nargs="?", help="directory, s3:// prefix, glob or saved index")
    p.add_argument("--world-size", type=int, default=1, help="number of ranks R (default 1)")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--no-shuffle", action="store_true", help="plan storage order")
    p.add_argument("--save-index", metavar="PATH", help="write the index (JSON) here")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout")
    p.add_argument(
        "--plot", metavar="PNG", help="draw the epoch line (or a mixture's passes), per-rank bytes"
    )
    p.add_argument("--storage-options", metavar="JSON", help="fsspec/s3fs options as JSON")
    p.add_argument(
        "--index-workers",
        type=int,
        default=1,
        metavar="N",
        help="processes scanning the shards while indexing (not --workers: DataLoader workers)",
    )
    p.add_argument("--write-sidecars", action="store_true", help="write .idx beside tar shards")
    p.add_argument("--no-sidecars", action="store_true", help="index tar shards, not sidecars")
    p.add_argument("--simulate-shards", type=int, metavar="S", help="plan S synthetic shards")
    p.add_argument(
        "--records-per-shard",
        type=int,
        metavar="N",
        help="with --simulate-shards (default 1,000)",
    )
    p.add_argument("--rank", type=int, metavar="K", help="print only rank K's plan")
    p.add_argument(
        "--stream",
        action="append",
        type=parse_stream,
        metavar="NAME=SOURCE[:WEIGHT]",
        help="a stream of a mixture (repeatable); SOURCE may be simulate:SHARDSxRECORDS",
    )
    p.add_argument("--epoch-size", type=int, metavar="E", help="a mixture's records an epoch")
    p.add_argument("--local-world-size", type=int, metavar="W", help="ranks per node (default 1)")
    p.add_argument("--locality", choices=["node"], help="nodes keep their records every epoch")
    p.add_argument("--epochs", type=int, metavar="E", help="simulate a node cache over E epochs")
    p.add_argument(
        "--cache-limit", metavar="BYTES", help="the node cache's size, e.g. 50GB (none: no bound)"
    )
    p.add_argument(
        "--sim-nodes",
        type=int,
        default=DEFAULT_SIM_NODES,
        metavar="N",
        help=f"nodes the cache simulation runs (default {DEFAULT_SIM_NODES}; the rest are alike)",
    )
    p.add_argument(
        "--shard-bytes",
        type=int,
        default=100_000_000,
        metavar="B",
        help="with --simulate-shards: stored bytes a shard (default 100 MB)",
    )
    add_pack_arguments(p)
    args = p.parse_args(argv)
    try:
        args.cache_limit = parse_size(args.cache_limit, "--cache-limit")
    except ValueError as e:
        p.error(str(e))
    if args.local_world_size is None:
        args.local_world_size = 1
    elif args.local_world_size < 1 or args.world_size % args.local_world_size:
        p.error(
            f"--local-world-size {args.local_world_size} must divide --world-size {args.world_size}"
        )
    args.cache = args.epochs is not None or args.cache_limit is not None
    if args.cache and (args.stream or args.rank is not None):
        p.error("--epochs / --cache-limit simulate one source's node cache: no --stream, --rank")
    if args.cache and args.epochs is None:
        args.epochs = 2
    if args.index_workers < 1:
        p.error(f"--index-workers must be >= 1, got {args.index_workers}")
    if args.stream:
        if args.source is not None or args.simulate_shards is not None:
            p.error("--stream plans a mixture: give no SOURCE or --simulate-shards with it")
    elif (args.source is None) == (args.simulate_shards is None):
        p.error("give either SOURCE, --simulate-shards or --stream")
    elif args.epoch_size is not None:
        p.error("--epoch-size applies to mixtures (--stream)")
    if args.simulate_shards is not None and args.records_per_shard is None:
        args.records_per_shard = 1000
    if args.rank is not None and not 0 <= args.rank < args.world_size:
        p.error(f"--rank must be in [0, {args.world_size}) for --world-size {args.world_size}")
    if args.rank is not None and args.stream:
        p.error("--rank plans one rank of one dataset, not of a mixture")
    for name in ("world_size", "workers", "simulate_shards", "records_per_shard", "epoch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    check_pack_arguments(p, args)
    return args


def plan_rows(args: argparse.Namespace, index: ShardIndex | None) -> tuple[list[RankRow], float]:
    sizes = sizes_of(args, index)
    rows = [RankRow(r, 0, 0, 0 if index is not None else None) for r in range(args.world_size)]
    touched: list[set[int]] = [set() for _ in range(args.world_size)]
    sampled = set(np.linspace(0, args.world_size - 1, MIXING_RANKS).astype(int).tolist())
    mixing = []
    plans = all_plans(sizes, num_workers=args.workers, **settings(args))
    total = args.world_size * args.workers
    for rank, worker, plan in tqdm(plans, total=total, desc="planning", disable=args.json):
        row = rows[rank]
        row.records += len(plan)
        touched[rank].update(plan.shards.tolist())
        if index is not None:
            row.bytes = (row.bytes or 0) + sum(
                index.bytes_for(int(s), int(a), int(b))
                for s, a, b in zip(plan.shards, plan.starts, plan.stops)
            )
        if rank in sampled and worker == 0 and len(plan):
            first = next(plan.chunks())
            mixing.append(distinct_per_batch(first.shards[:MIXING_RECORDS], 64))
    for row, shards in zip(rows, touched):
        row.shards = len(shards)
    mixes = [m for m in mixing if m == m]  # drop NaN (ranks with under a batch)
    return rows, float(np.mean(mixes)) if mixes else float("nan")


def summary(
    args: argparse.Namespace, index: ShardIndex | None, rows: list[RankRow], mixing: float
) -> dict[str, Any]:
    records = [r.records for r in rows]
    return {
        "num_shards": len(index) if index is not None else args.simulate_shards,
        "num_records": int(index.num_records)
        if index is not None
        else args.simulate_shards * args.records_per_shard,
        "world_size": args.world_size,
        "workers": args.workers,
        "seed": args.seed,
        "epoch": args.epoch,
        "drop_last": args.drop_last,
        "balance": max(records) / min(records) if min(records) else None,
        "mixing": None if mixing != mixing else mixing,
        **_amplification(index, rows),
        "per_rank": [r.__dict__ for r in rows],
    }


def _amplification(index: ShardIndex | None, rows: list[RankRow]) -> dict[str, Any]:
    """Bytes all ranks read against reading each shard once, and the shards of a single
    read group (a reader of any of its records reads all of it: pandas and pyarrow write
    one row group per file of up to a million rows or more)."""
    if index is None:
        return {}
    read = sum(r.bytes or 0 for r in rows)
    stored, single = index.stored_bytes(), index.single_group_shards()
    return {
        "bytes_stored": stored,
        "bytes_read": read,
        "read_amplification": read / stored if stored else None,
        "single_group_shards": single,
    }


def print_ranks(rows: list[dict[str, Any]]) -> None:
    print(f"{'rank':>6} {'records':>14} {'shards':>8} {'bytes':>16}")
    shown = rows if len(rows) <= 64 else [*rows[:16], None, *rows[-16:]]
    for r in shown:
        if r is None:
            print(f"{'...':>6}  ({len(rows) - 32} more ranks; --json lists all)")
            continue
        b = "-" if r["bytes"] is None else f"{r['bytes']:,}"
        print(f"{r['rank']:>6} {r['records']:>14,} {r['shards']:>8,} {b:>16}")


def print_table(doc: dict[str, Any]) -> None:
    rows = doc["per_rank"]
    print(
        f"{doc['num_shards']:,} shards, {doc['num_records']:,} records over "
        f"{doc['world_size']} ranks x {doc['workers']} workers "
        f"(seed {doc['seed']}, epoch {doc['epoch']})"
    )
    print_ranks(rows)
    balance = "-" if doc["balance"] is None else f"{doc['balance']:.3f}"
    mixing = "-" if doc["mixing"] is None else f"{doc['mixing']:.2f}"
    print(f"balance (max/min records): {balance}; mixing (distinct shards per 64): {mixing}")
    amp = doc.get("read_amplification")
    if amp is not None and amp > 1.05:
        single = doc["single_group_shards"]
        why = (
            f"{single:,} shards are one row group each (pandas and pyarrow write one row "
            "group per file of up to a million rows or more), "
            if single
            else ""
        )
        print(
            textwrap.fill(
                f"note: the ranks read {amp:.2f}x the bytes of reading each shard once: "
                f"{why}and every rank or worker reading part of a row group reads all of "
                "it. Write smaller row groups, e.g. df.to_parquet(path, row_group_size=10_000) or "
                "pyarrow.parquet.write_table(table, path, row_group_size=10_000)",
                width=100,
            )
        )


def print_mixture(doc: dict[str, Any]) -> None:
    print(
        f"{len(doc['streams'])} streams, {doc['epoch_size']:,} records an epoch over "
        f"{doc['world_size']} ranks x {doc['workers']} workers "
        f"(seed {doc['seed']}, epoch {doc['epoch']})"
    )
    print(
        f"{'stream':>12} {'records':>14} {'shards':>9} {'weight':>10} {'per rank/epoch':>15} "
        f"{'passes/epoch':>13} {'pass ends at epoch':>19}"
    )
    for s in doc["streams"]:
        ends = "-" if s["pass_ends_epoch"] is None else f"{s['pass_ends_epoch']:,}"
        print(
            f"{s['name'][:12]:>12} {s['num_records']:>14,} {s['num_shards']:>9,} "
            f"{s['weight']:>10,.4g} {s['records_per_rank']:>15,} {s['passes_per_epoch']:>13.3f} "
            f"{ends:>19}"
        )
    print_ranks(doc["per_rank"])


def _line(args: argparse.Namespace, index: ShardIndex | None) -> tuple[np.ndarray, int]:
    """The epoch line's shard ends and the records per rank, for the plot."""
    sizes = index.shard_sizes if index is not None else sizes_of(args, None)
    line = epoch_line(sizes, args.seed, args.epoch, not args.no_shuffle)
    return line.ends, rank_length(line.num_records, args.world_size, args.drop_last)


def shard_bytes(args: argparse.Namespace, index: ShardIndex | None) -> np.ndarray:
    """(S,) stored bytes of each shard (simulated: --shard-bytes each)."""
    if index is None:
        return np.full(args.simulate_shards, args.shard_bytes, dtype=np.float64)
    return np.asarray(index.table.column("bytes").to_numpy(), dtype=np.float64)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.storage_options_dict = storage_options(args)
        if args.pack:
            doc = pack_doc(args, load_index(args))
        elif args.rank is not None:
            doc = rank_doc(args, load_index(args))
        elif args.stream:
            doc = mixture_doc(args, load_streams(args))
            if args.plot:
                plot(doc, args.plot, None)
        elif args.cache:
            index = load_index(args)
            sizes = sizes_of(args, index)
            doc = cache_doc(args, sizes, shard_bytes(args, index), settings(args))
            if args.plot:
                plot_cache(doc, args.plot)
        else:
            index = load_index(args)
            rows, mixing = plan_rows(args, index)
            doc = summary(args, index, rows, mixing)
            if args.plot:
                plot(doc, args.plot, _line(args, index))
    except (ValueError, FileNotFoundError, PermissionError, ShardError) as e:
        print(f"shardstream-plan: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc))
    elif args.pack:
        print_pack(doc)
    elif args.rank is not None:
        print_rank(doc)
    elif args.stream:
        print_mixture(doc)
    elif args.cache:
        print_cache(doc)
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
