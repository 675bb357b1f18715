"""Benchmark of Arrow IPC shards: the loader against pyarrow's own IPC readers on the same
files, in one run. The bench's records (id, 128 int32 tokens, text, label) written as
Arrow IPC shards in the file format and in the stream format; each run in a fresh process,
its median over rounds: wall seconds, CPU seconds per record, and the ratio of CPU to the
limit (pyarrow reading the same shards).

    .venv/bin/python -m scripts.bench.ipc [--shards 8] [--records-per-shard 20000]

Runs: "pyarrow records" (open_file / open_stream, read_all, to_pylist: the record-mode
limit), "pyarrow batches" (the same tables cut into batches of 256, the batch-mode limit),
"ours records {file,stream}", "ours batches {file,stream}" (columns id, tokens, label).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from scripts.bench import REPO

BATCH = 256
COLUMNS = ["id", "tokens", "label"]
RUNS = [
    "pyarrow records",
    "pyarrow batches",
    "ours records file",
    "ours records stream",
    "ours batches file",
    "ours batches stream",
]


def make(root: Path, shards: int, per_shard: int, batch_rows: int) -> None:
    """root/file/*.arrow (file format) and root/stream/*.arrow (stream format)."""
    rng = np.random.default_rng(0)
    for kind in ("file", "stream"):
        (root / kind).mkdir(parents=True, exist_ok=True)
    for k in tqdm(range(shards), desc="writing IPC shards", leave=False):
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(per_shard, 128), dtype=np.int32)
        flat = pa.FixedSizeListArray.from_arrays(tokens.ravel(), 128)
        table = pa.table(
            {
                "id": ids,
                "tokens": flat.cast(pa.list_(pa.int32())),
                "text": pa.array([f"document {i}" for i in ids]),
                "label": ids % 10,
            }
        )
        for kind, new in (("file", pa.ipc.new_file), ("stream", pa.ipc.new_stream)):
            with new(root / kind / f"part-{k:05d}.arrow", table.schema) as w:
                for b in table.to_batches(max_chunksize=batch_rows):
                    w.write_batch(b)


def _pyarrow(root: Path, records: bool) -> Iterator[int]:
    for kind in ("file",):
        for p in sorted((root / kind).glob("*.arrow")):
            with pa.memory_map(str(p)) as source:
                table = pa.ipc.open_file(source).read_all()
            if records:
                for _ in table.to_pylist():
                    yield 1
            else:
                for b in table.select(COLUMNS).to_batches(max_chunksize=BATCH):
                    for c in b.columns:  # as a batch hands them on: numpy views
                        c.to_numpy(zero_copy_only=False)
                    yield b.num_rows


def _ours(root: Path, kind: str, records: bool) -> Iterator[int]:
    from shardstream.loader import StreamingDataset

    if records:
        for _ in StreamingDataset(str(root / kind), shuffle=True, seed=0):
            yield 1
    else:
        ds = StreamingDataset(
            str(root / kind), shuffle=True, seed=0, batch_size=BATCH, columns=COLUMNS
        )
        for b in ds:
            yield len(b["id"])


def one(name: str, root: Path) -> dict[str, float]:
    """Run `name` here: wall and CPU seconds and items."""
    import shardstream.loader  # noqa: F401  imports before the clock: import time is not read time

    parts = name.split()
    if parts[0] == "pyarrow":
        it = _pyarrow(root, parts[1] == "records")
    else:
        it = _ours(root, parts[2], parts[1] == "records")
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(it)
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "items": n}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.ipc", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records-per-shard", type=int, default=20_000)
    parser.add_argument("--batch-rows", type=int, default=2_000, help="rows a record batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make(root, args.shards, args.records_per_shard, args.batch_rows)
        results: dict[str, list[dict[str, float]]] = {n: [] for n in RUNS}
        for _ in tqdm(range(args.rounds), desc="rounds"):
            for name in RUNS:  # interleaved: a slow moment of the machine hits every run
                out = subprocess.run(
                    [sys.executable, "-m", "scripts.bench.ipc", "--one", name, str(root)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=REPO,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    records = args.shards * args.records_per_shard
    limit = {
        "records": statistics.median(r["cpu"] for r in results["pyarrow records"]),
        "batches": statistics.median(r["cpu"] for r in results["pyarrow batches"]),
    }
    print(f"{records} records, {args.shards} shards, record batches of {args.batch_rows}")
    print("| run | wall s | CPU s | CPU µs/record | CPU / limit |")
    print("|---|---|---|---|---|")
    for name, rs in results.items():
        wall = statistics.median(r["wall"] for r in rs)
        cpu = statistics.median(r["cpu"] for r in rs)
        assert all(r["items"] == records for r in rs), (name, rs)
        mode = "records" if "records" in name else "batches"
        print(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {cpu / records * 1e6:.2f} | "
            f"{cpu / limit[mode]:.2f}x |"
        )


if __name__ == "__main__":
    main()
