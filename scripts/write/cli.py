"""shardstream-write SOURCE DEST: write shards laid out for a job.

    shardstream-write SOURCE DEST [--world-size R --workers W] [--map MODULE:FUNCTION]
                      [--num-proc N] [--shard-bytes 256MB] [--row-group-rows N]
                      [--columns a,b] [--batch-size N] [--compression snappy]
                      [--tokens-column input_ids] [--storage-options JSON] [--quiet]

SOURCE is anything shardstream.StreamingDataset reads, or JSON Lines / CSV files; DEST a
local folder or any fsspec URL. The same options as shardstream.write_shards (see
docs/writing.md); a progress bar while it writes, and a last line with the figures.
Exits 1 with the error on one line for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import Any

from shardstream.sampler.checks import parse_size

from .writer import write_shards

__all__ = ["load_map", "main", "parse_args"]


def load_map(spec: str) -> Any:
    """The function ``MODULE:FUNCTION`` names (the current folder importable)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--map takes MODULE:FUNCTION (e.g. tokenize:encode), got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="shardstream-write", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    p.add_argument("source", help="what to read: a folder, URL, glob, saved index, or text files")
    p.add_argument("dest", help="the folder or URL to write the shards and their index to")
    p.add_argument("--world-size", type=int, help="the ranks of the job that will read it")
    p.add_argument("--workers", type=int, help="DataLoader workers a rank (with --world-size)")
    p.add_argument("--map", metavar="MODULE:FUNCTION", help="a function of a batch to apply")
    p.add_argument("--num-proc", type=int, default=1, help="processes writing (default 1)")
    p.add_argument("--shard-bytes", help="bytes a shard, e.g. 256MB (default: the layout's)")
    p.add_argument("--row-group-rows", type=int, help="rows a row group (default: the layout's)")
    p.add_argument("--columns", help="the columns to read, comma-separated (default: all)")
    p.add_argument("--batch-size", type=int, default=1000, help="records a --map batch")
    p.add_argument("--compression", default="snappy", help="Parquet codec (default snappy)")
    p.add_argument("--tokens-column", help="keep each record's token count in the index")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec options as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        options = json.loads(args.storage_options) if args.storage_options else None
        summary = write_shards(
            args.source,
            args.dest,
            map=load_map(args.map) if args.map else None,
            num_proc=args.num_proc,
            world_size=args.world_size,
            workers=args.workers,
            shard_bytes=parse_size(args.shard_bytes, "--shard-bytes"),
            row_group_rows=args.row_group_rows,
            columns=args.columns.split(",") if args.columns else None,
            batch_size=args.batch_size,
            compression=args.compression,
            tokens_column=args.tokens_column,
            storage_options=options,
            progress=not args.quiet,
        )
    except (ValueError, FileNotFoundError, ImportError, AttributeError) as e:
        print(f"shardstream-write: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {summary}")
    return 0
