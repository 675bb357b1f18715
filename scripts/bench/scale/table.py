"""scripts.bench.scale's output: its rows as one Markdown table."""

from __future__ import annotations

from typing import Any


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| # | measured | value | goal |")
    print("|---|---|---:|---|")
    for r in rows:
        value = f"{r['value']:.3f} s" if r["unit"] == "s" else f"{r['value']:.0f} MB"
        if "ratio" in r:
            value += f" ({r['ratio']:.2f}x)"
        if "mb" in r:
            value += f", +{r['mb']:.0f} MB"
        print(f"| {r['item']} | {r['what'].strip()} | {value} | {r['goal']} |")
