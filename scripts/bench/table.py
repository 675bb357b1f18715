"""scripts.bench's output: the table of its rows, or one JSON document (--json)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def report(rows: list[dict[str, Any]], nbytes: dict[str, int], args: argparse.Namespace) -> None:
    if args.json:
        print(
            json.dumps(
                {
                    "shards": args.shards,
                    "records_per_shard": args.records_per_shard,
                    "bytes": nbytes,
                    "runs": rows,
                },
                indent=2,
            )
        )
        return
    print(
        f"{args.shards} shards x {args.records_per_shard:,} records: "
        f"{nbytes['parquet'] / 1e6:.1f} MB Parquet, {nbytes['tar'] / 1e6:.1f} MB tar; "
        f"medians of {args.rounds} rounds"
    )
    print(
        f"{'run':<62} {'records/s':>10} {'MB/s':>6} {'cpu us':>6} {'first s':>7} {'first%':>6} "
        f"{'RSS':>5} {'+RSS':>5} {'held':>5} {'stall':>5} {'fetch':>5} {'x lim':>5} "
        f"{'cpu x':>5}  limit"
    )
    for r in rows:
        rps = f"{r['records_per_s']:,.0f}" if r["records_per_s"] else "-"
        ratio = f"{r['ratio_to_limit']:.2f}" if r["ratio_to_limit"] else "-"
        share = f"{r['fetched_x_share']:.2f}" if r["fetched_x_share"] else "-"
        held = f"{r['held_mb']:.0f}" if r.get("held_mb") else "-"
        stall = f"{r['stall_fraction']:.2f}" if r.get("stall_fraction") is not None else "-"
        cpu = f"{r['cpu_us_per_record']:.2f}" if r.get("cpu_us_per_record") else "-"
        cpu_x = f"{r['cpu_x_limit']:.2f}" if r.get("cpu_x_limit") else "-"
        print(
            f"{r['run']:<62} {rps:>10} {r['mb_per_s']:>6.1f} {cpu:>6} {r['first_item_s']:>7.3f} "
            f"{r['first_share']:>6.1%} {r['peak_rss_mb']:>5.0f} {r['rss_growth_mb']:>5.0f} "
            f"{held:>5} {stall:>5} {share:>5} {ratio:>5} {cpu_x:>5}  {r['limit'] or ''}"
        )
    print(
        "cpu us: CPU seconds per record (user + system, all threads, DataLoader workers "
        "included), median of the rounds; cpu x: that against the limit's. "
        "first%: time to the first item / the run's time. RSS: peak MB; +RSS: over the "
        "process's size after imports; held: the most MiB our reader held (decoded groups "
        "and reads under way, counted by the loader). stall: the loop's share of time "
        "waiting for data (0 workers). fetch: bytes our loader read (index included, "
        "DataLoader workers' reads too) / the Parquet bytes of the records it yielded."
    )
