"""Benchmark of filter= and split= (loader.selection) against pyarrow.dataset.

    .venv/bin/python -m scripts.bench.select [--quick] [--rounds 3]

Data, made once and reused under .cache/bench-select/ (--quick: 1/10 of it): 16 Parquet
files of ~64 MB (1 GB; pyarrow's writer, row groups of 20,000 rows): a sorted int64 id, a
language code (5 values, "en" 20% of rows, scattered), a float score and a 400-character
hex text that does not compress.

Rows, each --rounds times interleaved (medians; wall seconds and CPU seconds of the process,
all threads):

  pyarrow.dataset filter    ds.dataset(root).to_table(filter=expr, columns=[filter columns])
                            (the reference: the filter's column, read and filtered)
  ours, evaluate            loader.selection.select(index, fmt, filter=expr): the passing
                            rows of every shard, from a fresh index (the cost, once)
  ours, saved index         the same from the index saved after the evaluation (nothing
                            read: what later epochs and restarts pay)
  ours, epoch bytes         a filter that 10% of row groups satisfy (id < N/10, sorted):
                            bytes the epoch's reading fetched / the files' bytes

for `lang == "en"` and `score > 0.9` (scattered: no row group skipped; a dictionary
column of 5 values, a float column) and `id < N/10` (sorted: statistics skip 90% of the
row groups).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from tqdm import tqdm

from scripts.bench import REPO

ROOT = REPO / ".cache" / "bench-select"
FILES = 16
ROWS = 150_000  # a file: ~64 MB with 400 hex characters a row
LANGS = np.array(["en", "de", "fr", "ja", "es"])


def make_data(root: Path, rows: int) -> Path:
    """The dataset (kept: made once), returned."""
    done = root / "_done"  # (a name starting with _ is no data, to pyarrow and to us)
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in tqdm(range(FILES), desc="writing the bench's Parquet files"):
        ids = np.arange(k * rows, (k + 1) * rows)
        text = pa.array([rng.bytes(200).hex() for _ in range(rows)], pa.string())
        table = pa.table(
            {
                "id": ids,
                "lang": LANGS[rng.integers(0, 5, rows)],
                "score": rng.random(rows),
                "text": text,
            }
        )
        pq.write_table(table, root / f"part-{k:02d}.parquet", row_group_size=20_000)
    done.touch()
    return root


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Any) -> tuple[float, float, Any]:
    """(wall s, CPU s, result) of fn()."""
    wall, cpu = time.perf_counter(), _cpu()
    out = fn()
    return time.perf_counter() - wall, _cpu() - cpu, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1/10 of the data")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from shardstream.loader import StreamingDataset
    from shardstream.loader.formats import format_for
    from shardstream.loader.index.shard_index import ShardIndex
    from shardstream.loader.selection import select

    rows = ROWS // 10 if args.quick else ROWS
    root = make_data(ROOT / ("quick" if args.quick else "full"), rows)
    total = sum(f.stat().st_size for f in root.glob("*.parquet"))
    built = ShardIndex.build(str(root))
    fmt = format_for("parquet", file_schemas=built.schemas)
    filters = {
        "lang == 'en' (scattered)": (pc.field("lang") == "en", ["lang"]),
        "score > 0.9 (scattered)": (pc.field("score") > 0.9, ["score"]),
        "id < N/10 (sorted)": (pc.field("id") < FILES * rows // 10, ["id"]),
    }
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in tqdm(range(args.rounds), desc="rounds"):
            for name, (expr, cols) in filters.items():
                w, c, _ = timed(
                    lambda: pads.dataset(str(root)).to_table(filter=expr, columns=cols)  # noqa: B023
                )
                results.setdefault((name, "pyarrow.dataset filter"), []).append((w, c))
                index = ShardIndex(table=built.table, schemas=built.schemas, format="parquet")
                w, c, _ = timed(lambda: select(index, fmt, expr))  # noqa: B023
                results.setdefault((name, "ours, evaluate"), []).append((w, c))
                saved = Path(tmp) / "i.index.arrow"
                index.save(saved)
                again = ShardIndex.load(saved)
                w, c, _ = timed(lambda: select(again, fmt, expr))  # noqa: B023
                results.setdefault((name, "ours, saved index"), []).append((w, c))
    print(f"\n{FILES} files, {FILES * rows:,} rows, {total / 1e6:,.0f} MB; median of {args.rounds}")
    print("| filter | run | wall s | CPU s | x pyarrow.dataset (wall / CPU) |")
    print("|---|---|---:|---:|---:|")
    for name in filters:
        ref = results[(name, "pyarrow.dataset filter")]
        rw, rc = (statistics.median(x) for x in zip(*ref))
        for run in ("pyarrow.dataset filter", "ours, evaluate", "ours, saved index"):
            w, c = (statistics.median(x) for x in zip(*results[(name, run)]))
            print(f"| {name} | {run} | {w:.3f} | {c:.3f} | {w / rw:.2f} / {c / rc:.2f} |")
    expr, _ = filters["id < N/10 (sorted)"]
    ds = StreamingDataset(str(root), filter=expr, batch_size=1024, columns=["id", "text"])
    n = sum(len(b["id"]) for b in ds)
    fetched = ds.stats()["bytes_fetched"]
    print(
        f"\nid < N/10: {n:,} records read; the epoch fetched {fetched / 1e6:.1f} MB of "
        f"{total / 1e6:,.0f} MB ({fetched / total:.1%})"
    )


if __name__ == "__main__":
    main()
