"""scripts.bench.cloud's markdown table: one line a row; for ws=1 and rank 0 of 4 each,
records/s (x the row's base), seconds to the first record, CPU us a record, and the
requests before the first record / how many of them stood in line."""

from __future__ import annotations

from typing import Any

from scripts.bench.cloud import BATCH, CONCURRENCY, PER_SHARD, ROW_GROUP, SHARDS, TOKENS
from scripts.bench.cloud.runs import R4, ROWS, WS1, Cell

COLUMNS = (WS1, R4)


def shaping_text(latency_ms: float, mbps: float) -> str:
    """How the proxy shapes the traffic, in words."""
    if not latency_ms and not mbps:
        return "moto on loopback, unshaped (0 ms, unlimited; every request counted by the proxy)"
    latency = f"{latency_ms:g} ms first-byte latency" if latency_ms else "no added latency"
    rate = f"{mbps:g} MB/s a connection" if mbps else "unlimited bandwidth"
    return f"moto on loopback, {latency}, {rate}"


def _ratio(cell: Cell, base: Cell | None, row_base: str | None, note: str) -> str:
    if row_base is None:
        return "limit" if cell.row == "raw" else "base"
    if base is None or base.error or not base.rounds:
        return "x ?"
    ours, theirs = cell.median["records_per_s"], base.median["records_per_s"]
    tag = f" {note}" if note else ""
    return f"x{ours / theirs:.2f}{tag}" if theirs else "x ?"


def _cells(cell: Cell | None, base: Cell | None, row_base: str | None, note: str) -> list[str]:
    if cell is None:
        return ["", "", "", ""]
    if cell.error:
        return ["error", "", "", ""]
    m = cell.median
    cpu = m.get("cpu_us_per_record")
    return [
        f"{m['records_per_s']:,.0f} ({_ratio(cell, base, row_base, note)})",
        f"{m['first_s']:.3f}",
        f"{cpu:.1f}" if cpu is not None else "",
        f"{m['requests_before_first']:.0f} / {m['in_line_before_first']:.0f}",
    ]


def markdown(
    cells: dict[tuple[str, str], Cell], heading: str, rounds: int, measured: str = ""
) -> str:
    """The table of the measured cells, with its heading and notes (and any errors);
    `measured` names the shardstream the runs imported."""
    head = ["row"]
    for column in COLUMNS:
        head += [
            f"{column}: records/s (x base)",
            "first record s",
            "CPU us/record",
            "req / in line",
        ]
    lines = [
        f"### {heading}",
        "",
        f"{SHARDS} Parquet shards x {PER_SHARD:,} records (id, {TOKENS} int32 tokens, a text of "
        f"200-800 chars; row groups of {ROW_GROUP:,}) and the same records as {SHARDS} tar "
        f"shards; batches of {BATCH} of columns id, tokens; one pass a run, each in a fresh "
        f"process; median of {rounds} round(s)."
        + (f" shardstream from {measured}." * bool(measured)),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    errors = []
    for row in ROWS:
        got = [cells.get((row.key, c)) for c in COLUMNS]
        if not any(got):
            continue
        line = [row.label]
        for column, cell in zip(COLUMNS, got):
            base = cells.get((row.base, column)) if row.base else None
            line += _cells(cell, base, row.base, row.note)
            if cell is not None and cell.error:
                errors.append(f"- {row.label}, {column}: {cell.error}")
        lines.append("| " + " | ".join(line) + " |")
    lines += [
        "",
        "x base: Parquet rows against the raw pyarrow loop (limit), the mixture against our "
        "single-source saved-index batches (x ours), tar rows against webdataset (base). "
        "req / in line: HTTP requests that reached the server between the clock's start and "
        "the first record / the longest chain of them each sent after the one before was "
        f"answered (torchrun rows: rank 0's own requests, before its own first record; their "
        "records/s and first record are the job's: a rank's records over the slowest rank's "
        "pass, the last rank's first record). The raw reader keeps "
        f"{CONCURRENCY} ranged GETs in flight. x ?: the base row was not run (--only).",
        "",
    ]
    if errors:
        lines += ["Errors:", *errors, ""]
    return "\n".join(lines)


def raw_rows(cells: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    """The --json rows: each cell's median and rounds (or its error)."""
    out = []
    for (key, column), cell in cells.items():
        out.append(
            {
                "row": key,
                "column": column,
                "error": cell.error,
                "median": cell.median,
                "rounds": cell.rounds,
            }
        )
    return out
