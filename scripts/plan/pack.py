"""shardstream-plan's packing figures: a dataset packed into blocks of tokens over R ranks.

    shardstream-plan SOURCE --pack-column input_ids --pack-length 2049 [--eos 2] [--bos 1]
    shardstream-plan --simulate-shards 1000000 --records-per-shard 100
                   --tokens-per-document 500 --pack-length 2049 --world-size 4096

For an index the documents' token counts come from it (a saved index keeps them) or are
read once from the token column, as `StreamingDataset(pack=...)` reads them (and
--save-index then keeps them). A simulation takes every document to hold
--tokens-per-document tokens and touches no storage. Either prints the epoch's tokens,
the blocks every rank makes (the same on every rank: the spread is 0), the tokens each
rank trains on and the tokens no block holds an epoch.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_pack_arguments", "check_pack_arguments", "pack_doc", "print_pack"]


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
    if args.stream or args.rank is not None or args.cache:
        p.error("--pack-length plans one source's blocks: no --stream, --rank, --epochs")
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
