"""shardstream-plan's command line: every flag, its help (what the code does with it), and
the checks of flags that do not go together. Sizes in bytes take units (``200MB``,
``1.5GiB``: sampler.checks.parse_size) as well as plain integers."""

from __future__ import annotations

import argparse

from shardstream.sampler.advice import TARGET
from shardstream.sampler.checks import parse_size

from .cache import DEFAULT_SIM_NODES
from .mixture import parse_phase, parse_stream
from .pack import add_pack_arguments, check_pack_arguments

__all__ = ["parse_args"]

DESCRIPTION = (
    "Show how a sharded dataset splits over a job's ranks and DataLoader workers: records, "
    "shards and bytes each reads, the read amplification, and the Parquet layout (shard count, "
    f"rows per row group) that keeps every reader under {TARGET}x; save the dataset's index."
)


def _job(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        nargs="*",
        metavar="SOURCE",
        help="a directory, s3:// prefix, glob or saved index (*.index.arrow, *.json); several "
        "(what a shell glob expands to) are planned as one dataset",
    )
    p.add_argument("--world-size", type=int, default=1, metavar="R", help="ranks (default 1)")
    p.add_argument(
        "--workers", type=int, default=1, metavar="W", help="DataLoader workers a rank (default 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    p.add_argument("--epoch", type=int, default=0, help="the epoch planned (default 0)")
    p.add_argument(
        "--drop-last",
        action="store_true",
        help="drop the records past an equal share (drop_last=True) instead of padding",
    )
    p.add_argument("--no-shuffle", action="store_true", help="plan storage order (shuffle=False)")
    p.add_argument(
        "--save-index",
        metavar="PATH",
        help="save SOURCE's index: an Arrow IPC file for PATH ending in .index.arrow, JSON for "
        ".json (other names are refused: a source is taken as a saved index by its suffix)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print only JSON on stdout, with per-worker figures and the layout advice",
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="draw the epoch line and records and bytes per rank (a mixture: its passes; "
        "--epochs: the cache's bytes per epoch); needs matplotlib",
    )
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        help="fsspec/s3fs options as JSON (default: S3 settings from the AWS_* variables)",
    )


def _indexing(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--index-workers",
        type=int,
        default=1,
        metavar="N",
        help="processes scanning the shards while indexing (not --workers: DataLoader workers)",
    )
    p.add_argument(
        "--write-sidecars",
        action="store_true",
        help="write a .idx sidecar beside each plain tar shard of SOURCE",
    )
    p.add_argument(
        "--no-sidecars",
        action="store_true",
        help="ignore existing .idx sidecars and wids lists: index tar shards by their headers",
    )


def _simulation(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--simulate-shards",
        type=int,
        metavar="S",
        help="plan S equal synthetic shards instead of SOURCE (no storage is read)",
    )
    p.add_argument(
        "--records-per-shard",
        type=int,
        metavar="N",
        help="records of each simulated shard (default 1,000)",
    )
    p.add_argument(
        "--shard-bytes",
        metavar="BYTES",
        help="stored bytes of each simulated shard, e.g. 200MB: shows bytes, amplification "
        "and layout advice (the cache simulation takes 100MB when not given)",
    )
    p.add_argument(
        "--rows-per-group",
        type=int,
        metavar="N",
        help="rows of each simulated row group (default: the whole shard, one row group a "
        "file, as pandas writes)",
    )
    p.add_argument("--rank", type=int, metavar="K", help="print only rank K's plan, per worker")


def _mixture_and_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stream",
        action="append",
        type=parse_stream,
        metavar="NAME=SOURCE[:WEIGHT]",
        help="a stream of a mixture (repeatable); SOURCE may be simulate:SHARDSxRECORDS",
    )
    p.add_argument("--epoch-size", type=int, metavar="E", help="a mixture's records an epoch")
    p.add_argument(
        "--phase",
        action="append",
        type=parse_phase,
        metavar="ITEMS:NAME=W,...",
        help="a phase of a mixture's schedule (repeatable, in order): ITEMS of the epoch "
        "across ranks and each stream's weight in it (streams left out weigh 0)",
    )
    p.add_argument(
        "--local-world-size",
        type=int,
        metavar="W",
        help="ranks a node, for --locality and the cache simulation (default 1)",
    )
    p.add_argument("--locality", choices=["node"], help="nodes keep their records every epoch")
    p.add_argument(
        "--epochs",
        type=int,
        metavar="E",
        help="simulate a node cache over E epochs (default 2 with --cache-limit)",
    )
    p.add_argument(
        "--cache-limit",
        metavar="BYTES",
        help="the node cache's size, e.g. 50GB (not given: no bound)",
    )
    p.add_argument(
        "--sim-nodes",
        type=int,
        default=DEFAULT_SIM_NODES,
        metavar="N",
        help=f"nodes the cache simulation runs (default {DEFAULT_SIM_NODES}; the rest are alike)",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardstream-plan", description=DESCRIPTION)
    for add in (_job, _indexing, _simulation, _mixture_and_cache, add_pack_arguments):
        add(p)
    args = p.parse_intermixed_args(argv)
    sources: list[str] = args.source
    args.source = None if not sources else sources[0] if len(sources) == 1 else sources
    try:
        args.cache_limit = parse_size(args.cache_limit, "--cache-limit")
        args.shard_bytes = parse_size(args.shard_bytes, "--shard-bytes")
    except ValueError as e:
        p.error(str(e))
    _check(p, args)
    check_pack_arguments(p, args)
    if args.plot and (args.rank is not None or args.pack):
        p.error("--plot draws every rank's plan: not with --rank or --pack-length")
    return args


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse errors for values out of range and flags that do not go together."""
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
        weighed = [a.name for a in args.stream if a.weight is not None]
        if args.phase and weighed:
            p.error(f"--phase gives the weights: no :WEIGHT on --stream {', '.join(weighed)}")
    elif (args.source is None) == (args.simulate_shards is None):
        p.error("give either SOURCE, --simulate-shards or --stream")
    elif args.epoch_size is not None or args.phase:
        p.error("--epoch-size and --phase apply to mixtures (--stream)")
    if args.simulate_shards is not None and args.records_per_shard is None:
        args.records_per_shard = 1000
    if args.simulate_shards is None:
        for flag in ("records_per_shard", "rows_per_group"):
            if getattr(args, flag) is not None:
                p.error(f"--{flag.replace('_', '-')} describes --simulate-shards' shards")
    if args.source is None and (args.save_index or args.write_sidecars):
        p.error("--save-index and --write-sidecars need one dataset's SOURCE")
    if args.rank is not None and not 0 <= args.rank < args.world_size:
        p.error(f"--rank must be in [0, {args.world_size}) for --world-size {args.world_size}")
    if args.rank is not None and args.stream:
        p.error("--rank plans one rank of one dataset, not of a mixture")
    for name in (
        "world_size",
        "workers",
        "simulate_shards",
        "records_per_shard",
        "rows_per_group",
        "epoch_size",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
