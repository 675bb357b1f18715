"""Show how a sharded dataset splits over a job's ranks and workers, the layout that job
wants, and save the dataset's index.

    shardstream-plan SOURCE... [--world-size R] [--workers W] [--seed S] [--epoch E] [--drop-last]
                   [--save-index PATH] [--json] [--plot PNG] [--storage-options JSON]
                   [--index-workers N] [--write-sidecars] [--no-sidecars]
    shardstream-plan --simulate-shards S [--records-per-shard N] [--shard-bytes 200MB]
                   [--rows-per-group G] --world-size R [--rank K] ...
    shardstream-plan --stream NAME=SOURCE[:WEIGHT] [--stream ...] [--epoch-size E] --world-size R
    shardstream-plan SOURCE --pack-column COL --pack-length L [--eos ID] [--bos ID] --world-size R

Indexes SOURCE (a directory, s3:// prefix, glob or saved index, or several of them, as a
shell glob expands; S3 credentials and endpoint from the standard AWS variables such as
AWS_ENDPOINT_URL, or --storage-options), then prints one row per rank: records, shards
touched, bytes fetched (the row groups or tar ranges that hold its records, whole) and their
ratio to the records' share of the stored bytes, with the balance (max/min) and the mixing
metric (mean distinct shards in a batch of 64 consecutive records) of a sample of ranks; then
the read amplification (all readers, and the worst worker) and the layout advice for R ranks
x W workers (scripts/plan_advice.py, sampler/advice.py): the shard count and rows per row
group that keep every reader under 1.1x, or that the data is too small for that many
readers. --simulate-shards plans a synthetic dataset of equal shards (1,000 records each
unless --records-per-shard) without touching storage; with --shard-bytes it has bytes, in
row groups of --rows-per-group rows. --rank K prints one rank's plan only (its pieces:
shard, rows, bytes), computed without planning the others: O(shards) at any world size.
--stream plans a mixture (see scripts/plan_mixture.py): per stream, records per rank and
epoch, passes per epoch and the epoch at which its current pass ends; SOURCE may be
simulate:SHARDSxRECORDS. --pack-length (scripts/plan_pack.py) prints the blocks of tokens
every rank makes and the tokens dropped an epoch; --simulate-shards with it takes
--tokens-per-document.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from shardstream.loader.errors import ShardError
from shardstream.sampler.epoch import epoch_line, rank_length

# torch-free imports only: a simulated plan never imports torch (2.5 s of the command
# otherwise); indexing a SOURCE imports the loader (and torch) when it is asked for
from .advice import (
    advice_doc,
    print_advice,
    print_amplification,
    say,
)
from .args import parse_args
from .cache import cache_doc, print_cache
from .load import load_index, load_streams, storage_options
from .mixture import mixture_doc
from .pack import mixture_pack_doc, pack_doc, print_mixture_pack, print_pack
from .plot import plot, plot_cache
from .rank import print_rank, rank_doc, settings, sizes_of
from .workers import RankRow, WorkerRow, plan_rows, worst_worker

if TYPE_CHECKING:
    from shardstream.loader.index.shard_index import ShardIndex

__all__ = ["main", "summary"]

CACHE_SHARD_BYTES = 100_000_000  # a simulated shard's bytes in the cache simulation


def summary(
    args: argparse.Namespace,
    index: ShardIndex | None,
    rows: list[RankRow],
    workers: list[WorkerRow],
    mixing: float,
) -> dict[str, Any]:
    """The plan of every rank and worker as JSON data, with the read amplification, the
    padding (or the records dropped) and the layout advice."""
    records = [r.records for r in rows]
    num_records = (
        int(index.num_records)
        if index is not None
        else args.simulate_shards * args.records_per_shard
    )
    read = args.world_size * rank_length(num_records, args.world_size, args.drop_last)
    doc = {
        "num_shards": len(index) if index is not None else args.simulate_shards,
        "num_records": num_records,
        "world_size": args.world_size,
        "workers": args.workers,
        "seed": args.seed,
        "epoch": args.epoch,
        "drop_last": args.drop_last,
        "padded_records": max(0, read - num_records),
        "dropped_records": max(0, num_records - read),
        "balance": max(records) / min(records) if min(records) else None,
        "mixing": None if mixing != mixing else mixing,
        **_amplification(args, index, rows),
        "worst_worker": worst_worker(workers),
        "per_rank": [asdict(r) for r in rows],
        "per_worker": [asdict(w) for w in workers],
    }
    doc["advice"] = advice_doc(args, index, num_records, doc.get("bytes_stored"))
    return doc


def _amplification(
    args: argparse.Namespace, index: ShardIndex | None, rows: list[RankRow]
) -> dict[str, Any]:
    """Bytes all ranks fetch against reading each shard once, and the shards of a single
    row group (a reader of any of its records fetches all of it: pandas and pyarrow write
    one row group per file of up to a million rows or more)."""
    if index is not None:
        stored, single = index.stored_bytes(), index.single_group_shards()
    elif args.shard_bytes is not None:
        stored = args.simulate_shards * args.shard_bytes
        one_group = (args.rows_per_group or args.records_per_shard) >= args.records_per_shard
        single = args.simulate_shards if one_group and args.records_per_shard > 1 else 0
    else:
        return {"bytes_stored": None}
    read = sum(r.bytes or 0 for r in rows)
    return {
        "bytes_stored": stored,
        "bytes_read": read,
        "read_amplification": read / stored if stored else None,
        "single_group_shards": single,
    }


def print_ranks(rows: list[dict[str, Any]]) -> None:
    amp = any(r.get("share_bytes") for r in rows)
    print(
        f"{'rank':>6} {'records':>14} {'shards':>8} {'bytes':>16}"
        + (f" {'fetched/share':>14}" if amp else "")
    )
    shown = rows if len(rows) <= 64 else [*rows[:16], None, *rows[-16:]]
    for r in shown:
        if r is None:
            print(f"{'...':>6}  ({len(rows) - 32} more ranks; --json lists all)")
            continue
        b = "-" if r["bytes"] is None else f"{r['bytes']:,}"
        line = f"{r['rank']:>6} {r['records']:>14,} {r['shards']:>8,} {b:>16}"
        if amp:
            share = r.get("share_bytes")
            line += f" {r['bytes'] / share:>13.2f}x" if share else f" {'-':>14}"
        print(line)


def print_table(doc: dict[str, Any]) -> None:
    print(
        f"{doc['num_shards']:,} shards, {doc['num_records']:,} records over "
        f"{doc['world_size']} ranks x {doc['workers']} workers "
        f"(seed {doc['seed']}, epoch {doc['epoch']})"
    )
    print_ranks(doc["per_rank"])
    balance = "-" if doc["balance"] is None else f"{doc['balance']:.3f}"
    mixing = "-" if doc["mixing"] is None else f"{doc['mixing']:.2f}"
    print(f"balance (max/min records): {balance}; mixing (distinct shards per 64): {mixing}")
    length = doc["per_rank"][0]["records"] if doc["per_rank"] else 0
    if doc["padded_records"]:
        say(
            f"padding: {doc['padded_records']:,} records are read twice, so that every rank "
            f"reads {length:,} (--drop-last drops the tail instead)."
        )
    if doc["dropped_records"]:
        say(f"drop-last: {doc['dropped_records']:,} records are not read this epoch.")
    print_amplification(doc)
    print_advice(doc)


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
        weight = "phases" if s["weight"] is None else f"{s['weight']:,.4g}"
        print(
            f"{s['name'][:12]:>12} {s['num_records']:>14,} {s['num_shards']:>9,} "
            f"{weight:>10} {s['records_per_rank']:>15,} {s['passes_per_epoch']:>13.3f} "
            f"{ends:>19}"
        )
    if len(doc["phases"]) > 1:
        names = [s["name"][:12] for s in doc["streams"]]
        print(f"{'phase':>12} {'items':>14} {'per rank':>9} " + " ".join(f"{n:>12}" for n in names))
        for p, ph in enumerate(doc["phases"], 1):
            counts = " ".join(f"{c:>12,}" for c in ph["records_per_stream"])
            print(f"{p:>12} {ph['items']:>14,} {ph['per_rank']:>9,} {counts}")
    print_ranks(doc["per_rank"])


def _line(args: argparse.Namespace, index: ShardIndex | None) -> tuple[np.ndarray, int]:
    """The epoch line's shard ends and the records per rank, for the plot."""
    sizes = index.shard_sizes if index is not None else sizes_of(args, None)
    line = epoch_line(sizes, args.seed, args.epoch, not args.no_shuffle)
    return line.ends, rank_length(line.num_records, args.world_size, args.drop_last)


def shard_bytes(args: argparse.Namespace, index: ShardIndex | None) -> np.ndarray:
    """(S,) stored bytes of each shard (simulated: --shard-bytes each, 100 MB if not given)."""
    if index is None:
        each = args.shard_bytes or CACHE_SHARD_BYTES
        return np.full(args.simulate_shards, each, dtype=np.float64)
    return np.asarray(index.table.column("bytes").to_numpy(), dtype=np.float64)


def _doc(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON data of what was asked for (indexing the source where there is one)."""
    if args.pack:
        return mixture_pack_doc(args) if args.stream else pack_doc(args, load_index(args))
    if args.rank is not None:
        return rank_doc(args, load_index(args))
    if args.stream:
        doc = mixture_doc(args, load_streams(args))
        if args.plot:
            plot(doc, args.plot, None)
        return doc
    index = load_index(args)
    if args.cache:
        doc = cache_doc(args, sizes_of(args, index), shard_bytes(args, index), settings(args))
        if args.plot:
            plot_cache(doc, args.plot)
        return doc
    rows, workers, mixing = plan_rows(args, index)
    doc = summary(args, index, rows, workers, mixing)
    if args.plot:
        plot(doc, args.plot, _line(args, index))
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.storage_options_dict = storage_options(args)
        doc = _doc(args)
    except (ValueError, FileNotFoundError, PermissionError, ShardError) as e:
        print(f"shardstream-plan: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc))
    elif args.pack:
        (print_mixture_pack if args.stream else print_pack)(doc)
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
