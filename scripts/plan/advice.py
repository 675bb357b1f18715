"""shardstream-plan's read amplification and layout advice: what the plan's readers fetch
against what they read, and the shard count and rows per row group (sampler.advice) that
keep every reader of the job under 1.1x, or the verdict that the data is too small for that
many readers; printed wrapped at 100 columns, and as the "advice" of --json."""

from __future__ import annotations

import argparse
import math
import shlex
import textwrap
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from shardstream.sampler.advice import GROUP_BYTES, MIN_GROUP_BYTES, SHARD_BYTES, TARGET, advise

from .plot import human_bytes

if TYPE_CHECKING:
    from shardstream.loader.index.shard_index import ShardIndex

__all__ = ["advice_doc", "current_layout", "print_advice", "print_amplification", "say"]

WIDTH = 100


def current_layout(args: argparse.Namespace, index: ShardIndex | None) -> tuple[int, int | None]:
    """(shards, the most rows in one row group: None where unknown, as for tar)."""
    if index is None:
        return args.simulate_shards, args.rows_per_group or args.records_per_shard
    import pyarrow.compute as pc

    table = index.table
    if "row_group_rows" not in table.column_names:
        return len(index), None
    most = pc.max(pc.list_flatten(table.column("row_group_rows"))).as_py()
    return len(index), None if most is None else int(most)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def advice_doc(
    args: argparse.Namespace, index: ShardIndex | None, num_records: int, stored: int | None
) -> dict[str, Any] | None:
    """The layout advice for --world-size x --workers as JSON data (None without bytes)."""
    if not stored or num_records <= 0:
        return None
    shards, rows = current_layout(args, index)
    a = advise(
        num_records,
        args.world_size,
        args.workers,
        stored_bytes=stored,
        drop_last=args.drop_last,
        current_shards=shards,
        current_rows_per_group=rows,
        locality=args.locality == "node",
    )
    source = args.source if isinstance(args.source, str) else "SOURCE"
    command = f"shardstream-write {shlex.quote(source)} DEST"
    return {
        **asdict(a),
        "worst_amplification": _finite(a.worst_amplification),
        "mean_amplification": _finite(a.mean_amplification),
        "verdict": "fits" if a.fits else "too_small",
        "target": TARGET,
        "group_bytes": round(a.group_bytes),
        "shard_bytes": round(a.shard_bytes),
        "current_rows_per_group": rows,
        "command": f"{command} --world-size {args.world_size} --workers {args.workers}",
    }


def say(text: str) -> None:
    """Print `text` wrapped at 100 columns."""
    print(textwrap.fill(text, width=WIDTH))


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def print_amplification(doc: dict[str, Any]) -> None:
    """What the plan's readers fetch against reading each shard once, the worst worker,
    and why (shards of one row group)."""
    amp, worst = doc.get("read_amplification"), doc.get("worst_worker")
    if amp is None:
        return
    text = f"read amplification: the readers fetch {amp:.2f}x the bytes of reading each shard once"
    if worst is not None:
        text += (
            f"; the worst worker (rank {worst['rank']}, worker {worst['worker']}) fetches "
            f"{worst['amplification']:.2f}x its records' share of the bytes"
        )
    single = doc.get("single_group_shards") or 0
    if single and amp > 1.05:
        text += (
            f". {single:,} of {doc['num_shards']:,} shards are one row group each (pandas and "
            "pyarrow write one row group per file of up to a million rows or more), and a "
            "reader of any row of a row group fetches all of it"
        )
    say(text + ".")


def print_advice(doc: dict[str, Any]) -> None:
    """The layout advice: fine as it is, a layout to write, or too small for the job."""
    a = doc.get("advice")
    if a is None:
        if doc.get("bytes_stored") is None:
            say("layout: give --shard-bytes for the bytes, amplification and layout advice.")
        return
    job = f"{a['world_size']} ranks x {a['workers']} workers"
    worst = (doc.get("worst_worker") or {}).get("amplification")
    if worst is not None and worst <= TARGET:
        current = a["current_rows_per_group"]
        now = "" if current is None else f" (the largest now: {current:,})"
        say(
            f"layout: fine for {job}: every reader fetches at most {worst:.2f}x its records' "
            f"share. Row groups of at most {a['max_rows_per_group']:,} rows{now} keep every "
            f"reader within {TARGET}x in any epoch's order."
        )
        return
    say(_layout_text(a, job) if a["fits"] else _too_small_text(a, job))
    print(f"    {a['command']}")
    say(
        f"or pass row_group_size={a['rows_per_group']} to pandas' to_parquet or "
        "pyarrow.parquet.write_table."
    )


def _reader(a: dict[str, Any]) -> str:
    part = a["records_per_reader"]
    return (
        f"each of the {a['readers']:,} readers gets {part:,} records "
        f"({human_bytes(part * a['bytes_per_row'])})"
    )


def _too_small_text(a: dict[str, Any], job: str) -> str:
    """The verdict: row groups small enough for this many readers hold under 64 KB."""
    floor = human_bytes(MIN_GROUP_BYTES)
    largest = human_bytes(a["max_rows_per_group"] * a["bytes_per_row"])
    return (
        f"layout: the data is too small for {job}: {_reader(a)}, and keeping every reader "
        f"within {TARGET}x needs row groups of at most {a['max_rows_per_group']:,} rows "
        f"({largest}), under the {floor} a row group should hold. With row groups of {floor} "
        f"it can feed {_plural(a['readers_fed'], 'reader')} (ranks x workers) within "
        f"{TARGET}x. To read it with {job} anyway, write row groups of "
        f"{a['rows_per_group']:,} rows:"
    )


def _layout_text(a: dict[str, Any], job: str) -> str:
    """The advised layout in words, and where storage's size ranges gave way."""
    shards = _plural(a["num_shards"], "shard")
    text = (
        f"layout for {job}: {_reader(a)}. In row groups of {a['rows_per_group']:,} rows "
        f"({human_bytes(a['group_bytes'])}), {shards} of {a['rows_per_shard']:,} rows "
        f"({human_bytes(a['shard_bytes'])}), every reader fetches at most "
        f"{a['worst_amplification']:.2f}x its records' bytes (about "
        f"{a['mean_amplification']:.2f}x over the job)."
    )
    low, high = (f"{x / 1e6:g}" for x in GROUP_BYTES)
    if a["groups_below_range"] and a["rows_per_group"] == a["max_rows_per_group"]:
        text += (
            f" Row groups of {low}-{high} MB would suit storage better, but the readers' parts "
            "are too small for them: amplification wins."
        )
    if a["shards_below_range"]:
        text += f" The data is too small for shards of {SHARD_BYTES[0] / 1e6:g} MB or more."
    return text + " Write it so with:"
