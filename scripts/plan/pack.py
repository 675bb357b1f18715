"""shardstream-plan's packing figures: a dataset packed into blocks of tokens over R ranks.

    shardstream-plan SOURCE --pack-column input_ids --pack-length 2049 [--eos 2] [--bos 1]
    shardstream-plan --simulate-shards 1000000 --records-per-shard 100
                   --tokens-per-document 500 --pack-length 2049 --world-size 4096
    shardstream-plan --stream web=SOURCE --stream code=SOURCE --pack-column input_ids
                   --pack-length 2049 [--phase ITEMS:web=0.8,code=0.2 ...] --world-size 64

For an index the documents' token counts come from it (a saved index keeps them) or are
read once from the token column, as `StreamingDataset(pack=...)` reads them (and
--save-index then keeps them). A simulation takes every document to hold
--tokens-per-document tokens and touches no storage. Either prints the epoch's tokens,
the blocks every rank makes (the same on every rank: the spread is 0), the tokens each
rank trains on and the tokens no block holds an epoch. A mixture (--stream, read sources
only) prints each stream's blocks of a pass and, phase by phase (--phase), the blocks
and tokens each rank takes of each stream.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "add_pack_arguments",
    "check_pack_arguments",
    "mixture_pack_doc",
    "pack_doc",
    "print_mixture_pack",
    "print_pack",
]


def add_pack_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pack-column", metavar="COL", help="a list-of-token-ids column to pack")
    p.add_argument("--pack-length", type=int, metavar="L", help="tokens a block")
    p.add_argument("--eos", type=int, metavar="ID", help="token put after each document")
    p.add_argument("--bos", type=int, metavar="ID", help="token put before each document")
    p.add_argument(
        "--tokens-per-document",
        type=int,
        metavar="N",
        help="with --simulate-shards and --pack-length: tokens of every document",
    )


def check_pack_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse errors for packing arguments that do not go together."""
    args.pack = args.pack_length is not None
    if not args.pack:
        if args.pack_column or args.tokens_per_document is not None:
            p.error("--pack-column / --tokens-per-document need --pack-length")
        return
    if args.pack_length < 1:
        p.error(f"--pack-length must be >= 1, got {args.pack_length}")
    if args.rank is not None or args.cache:
        p.error("--pack-length plans blocks: no --rank, --epochs")
    if args.stream:
        if not args.pack_column or any(a.simulated for a in args.stream):
            p.error("--pack-length with --stream reads the streams: --pack-column, no simulate:")
        return
    if args.simulate_shards is not None:
        if args.tokens_per_document is None or args.tokens_per_document < 0:
            p.error("--simulate-shards with --pack-length needs --tokens-per-document N >= 0")
    elif not args.pack_column:
        p.error("--pack-length needs --pack-column (the token column of SOURCE)")


def pack_doc(args: argparse.Namespace, index: Any) -> dict[str, Any]:
    """The packing figures of `index` (None: the simulation) over --world-size ranks."""
    from shardstream.sampler.packing import blocks_per_rank, dropped

    ranks, length = args.world_size, args.pack_length
    if index is None:
        separators = int(args.eos is not None) + int(args.bos is not None)
        each = args.tokens_per_document + separators if args.tokens_per_document else 0
        documents = args.simulate_shards * args.records_per_shard
        tokens = documents * each
    else:
        from shardstream.loader import Pack, StreamingDataset

        ds = StreamingDataset(
            index,
            pack=Pack(args.pack_column, length, eos=args.eos, bos=args.bos),
            num_replicas=ranks,
            rank=0,
            storage_options=args.storage_options_dict,
        )
        figures = ds.stats()["pack"]
        tokens, documents = figures["tokens"], figures["documents"]
        if args.save_index:  # now with the token counts
            ds.index.save(args.save_index, args.storage_options_dict)
    blocks = blocks_per_rank(tokens, length, ranks)
    lost = dropped(tokens, length, ranks)
    return {
        "pack_length": length,
        "world_size": ranks,
        "documents": documents,
        "tokens": tokens,
        "blocks_per_rank": blocks,
        "tokens_per_rank": blocks * length,
        "block_spread": 0,
        "tokens_dropped": lost,
        "dropped_share": lost / tokens if tokens else 0.0,
    }


def print_pack(doc: dict[str, Any]) -> None:
    print(
        f"{doc['documents']:,} documents, {doc['tokens']:,} tokens an epoch (separators "
        f"included), blocks of {doc['pack_length']:,} over {doc['world_size']:,} ranks:"
    )
    print(f"  blocks per rank      {doc['blocks_per_rank']:,} (every rank; spread 0)")
    print(f"  tokens per rank      {doc['tokens_per_rank']:,}")
    print(
        f"  tokens dropped       {doc['tokens_dropped']:,} an epoch "
        f"({100 * doc['dropped_share']:.4f}%: the last block's tail and the blocks left "
        "over when they are shared out equally)"
    )


def mixture_pack_doc(args: argparse.Namespace) -> dict[str, Any]:
    """A mixture's packing figures over --world-size ranks: per stream its tokens and the
    blocks each rank makes of a pass; per phase (one without --phase) the blocks each rank
    takes of each stream, and their tokens."""
    from shardstream.loader import Pack, Stream, StreamingDataset

    ds: Any = StreamingDataset(
        [Stream(a.source, weight=a.weight, name=a.name) for a in args.stream],
        pack=Pack(args.pack_column, args.pack_length, eos=args.eos, bos=args.bos),
        epoch_size=args.epoch_size,
        schedule=args.phase or None,
        num_replicas=args.world_size,
        rank=0,
        seed=args.seed,
        storage_options=args.storage_options_dict,
    )
    stats = ds.stats()
    names = [a.name for a in args.stream]
    counts = ds.sampler.epoch_phases().counts
    return {
        "pack_length": args.pack_length,
        "world_size": args.world_size,
        "epoch_blocks": ds.sampler.epoch_size,
        "streams": stats["pack"],
        "phases": [
            {
                "blocks_per_rank": sum(c),
                "tokens_per_rank": sum(c) * args.pack_length,
                "per_stream": dict(zip(names, c)),
            }
            for c in counts
        ],
    }


def print_mixture_pack(doc: dict[str, Any]) -> None:
    length, ranks = doc["pack_length"], doc["world_size"]
    print(f"{doc['epoch_blocks']:,} blocks of {length:,} tokens an epoch over {ranks:,} ranks")
    print(f"{'stream':>12} {'tokens':>16} {'blocks/rank/pass':>17} {'tokens dropped':>15}")
    for name, s in doc["streams"].items():
        print(
            f"{name[:12]:>12} {s['tokens']:>16,} {s['blocks_per_rank']:>17,} "
            f"{s['tokens_dropped']:>15,}"
        )
    names = list(doc["streams"])
    print(
        f"{'phase':>12} {'blocks/rank':>12} {'tokens/rank':>16} "
        + " ".join(f"{n[:12]:>12}" for n in names)
    )
    for p, ph in enumerate(doc["phases"], 1):
        per = " ".join(f"{ph['per_stream'][n]:>12,}" for n in names)
        print(f"{p:>12} {ph['blocks_per_rank']:>12,} {ph['tokens_per_rank']:>16,} {per}")
