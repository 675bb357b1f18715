"""shardstream-plan's sources: the index of SOURCE or of each --stream, built (or loaded)
through scripts/plan_index, which imports the loader only when a source is indexed."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream.loader.index.shard_index import ShardIndex

__all__ = ["load_index", "load_streams", "storage_options"]


def _indexing() -> Any:
    """scripts/plan_index (imports the loader: only when a SOURCE is indexed)."""
    from . import index as plan_index

    return plan_index


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        return json.loads(args.storage_options) if args.storage_options else None
    except json.JSONDecodeError as e:
        raise ValueError(f"--storage-options is not valid JSON: {e}") from None


def load_streams(args: argparse.Namespace) -> list[ShardIndex | None]:
    """Each --stream's index (None for a simulated one)."""
    streams: list[Any] = args.stream
    if args.save_index:
        raise ValueError("--save-index saves one dataset's index: plan each stream alone")
    options = storage_options(args)
    return [
        None
        if a.simulated is not None
        else _indexing().build_index(
            a.source, options, args.index_workers, not args.no_sidecars, quiet=args.json
        )
        for a in streams
    ]


def load_index(args: argparse.Namespace) -> ShardIndex | None:
    """The index of SOURCE (one source, or a list of them: what a shell glob expands to),
    saved to --save-index and with sidecars written where asked; None for a simulation."""
    if args.simulate_shards is not None:
        return None
    options = storage_options(args)
    if args.save_index:
        _indexing().check_index_path(args.save_index)
    index = _indexing().build_index(
        args.source, options, args.index_workers, not args.no_sidecars, quiet=args.json
    )
    if args.save_index:
        index.save(args.save_index, options)
    if args.write_sidecars:
        _indexing().save_sidecars(index, options, quiet=args.json)
    return index
