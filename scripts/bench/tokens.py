"""Benchmark packing: tokens/s and CPU per token of `pack=`, against a raw loop, in one run.

    python -m scripts.bench.tokens [--shards 16] [--docs 2000] [--length 2049]
                                   [--batch 8] [--rounds 3] [--json]

Generates tokenized Parquet shards (an int32 `input_ids` list a row; documents of 10 to
3,000 tokens, log-normal, mean ~400; row groups of 256 documents), saves their index with
the token counts, then runs each measurement in its own process --rounds times (medians):

  raw numpy pack          pyarrow iter_batches in storage order, each batch's lists
                          flattened, eos put after each document (np.insert), joined to
                          the carry and cut into batches of blocks (reshape): tokens only
  raw numpy pack + ids    the same, with position_ids and document_ids as ours makes them:
                          the limit `ours` rows are compared with
  torchtitan buffer       a Python list buffer extended with each document and eos, blocks
                          cut off its head as torch.LongTensor (torchtitan's HF loop)
  ours pack ...           StreamingDataset(pack=Pack(...), batch_size=B): from the saved
                          index; with the counts read at construction; rank 0 of 4; two
                          DataLoader workers

Columns: tokens/s, CPU ns per token (all threads and workers) and its ratio to the limit's,
time to first batch from the start of construction. Then: `len` from a saved index of
1,000,000 shards (load + counts + blocks), and the blocks each of 4 ranks makes with the
tokens dropped.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from scripts.bench import REPO

EOS = 0
COLUMN = "input_ids"


def make_data(root: Path, shards: int, docs: int) -> None:
    rng = np.random.default_rng(0)
    (root / "tokens").mkdir(parents=True)
    for s in range(shards):
        lengths = np.clip(rng.lognormal(5.6, 0.9, docs), 10, 3000).astype(np.int64)
        values = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.int32)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(
            pa.table({COLUMN: column}),
            root / "tokens" / f"part-{s:05d}.parquet",
            row_group_size=256,
        )
    from shardstream.loader import Pack, StreamingDataset

    ds = StreamingDataset(root / "tokens", pack=Pack(COLUMN, 16, eos=EOS))
    ds.index.save(root / "tokens.index.arrow")


def raw_pack(root: Path, length: int, batch: int, ids: bool) -> Iterator[int]:
    """Storage order, numpy packing: yields tokens per batch of blocks."""
    import torch

    files = sorted((root / "tokens").glob("*.parquet"))
    want = length * batch
    carry = [np.zeros(0, np.int64)] * 3
    doc_base = 0
    for f in files:
        for rb in pq.ParquetFile(f).iter_batches(columns=[COLUMN], batch_size=1024):
            col = rb.column(0)
            values = col.flatten().to_numpy().astype(np.int64)
            lengths = np.diff(col.offsets.to_numpy())
            ends = np.cumsum(lengths)
            tokens = np.insert(values, ends, EOS)
            parts = [tokens]
            if ids:  # as cheaply as numpy makes them: one repeat each
                places = lengths + 1
                starts = np.cumsum(places) - places
                parts.append(np.arange(tokens.size) - np.repeat(starts, places))
                parts.append(np.repeat(np.arange(doc_base, doc_base + lengths.size), places))
                doc_base += lengths.size
            joined = [np.concatenate((c, p)) for c, p in zip(carry, parts)]
            whole = joined[0].size // want * want
            for lo in range(0, whole, want):
                out = [torch.from_numpy(j[lo : lo + want].reshape(batch, length)) for j in joined]
                if ids:
                    out[2] = out[2] - out[2][:, :1]
                yield want
            carry = [j[whole:] for j in joined] + [np.zeros(0, np.int64)] * (3 - len(joined))


def titan_buffer(root: Path, length: int, batch: int) -> Iterator[int]:
    """torchtitan's HuggingFace text loop after tokenizing: a list buffer."""
    import torch

    buffer: list[int] = []
    made = 0
    for f in sorted((root / "tokens").glob("*.parquet")):
        for rb in pq.ParquetFile(f).iter_batches(columns=[COLUMN], batch_size=1024):
            for doc in rb.column(0).to_pylist():
                buffer.extend(doc)
                buffer.append(EOS)
                while len(buffer) >= length:
                    torch.LongTensor(buffer[:length])
                    buffer = buffer[length:]
                    made += 1
                    if made == batch:
                        made = 0
                        yield length * batch


def ours(root: Path, length: int, batch: int, how: str) -> Iterator[int]:
    from torch.utils.data import DataLoader

    from shardstream.loader import Pack, StreamingDataset

    source = root / "tokens" if how == "counted" else root / "tokens.index.arrow"
    replicas = 4 if how == "rank 0 of 4" else 1
    ds = StreamingDataset(
        source, pack=Pack(COLUMN, length, eos=EOS), batch_size=batch, num_replicas=replicas, rank=0
    )
    items: Any = ds if how != "w2" else DataLoader(ds, batch_size=None, num_workers=2)
    for b in items:
        yield int(b[COLUMN].numel())


RUNS = {
    "raw numpy pack": ("", lambda r, a: raw_pack(r, a.length, a.batch, False)),
    "raw numpy pack + ids": ("", lambda r, a: raw_pack(r, a.length, a.batch, True)),
    "torchtitan buffer": ("raw numpy pack", lambda r, a: titan_buffer(r, a.length, a.batch)),
    "ours pack w0, saved index": (
        "raw numpy pack + ids",
        lambda r, a: ours(r, a.length, a.batch, "saved"),
    ),
    "ours pack w0, counts read": (
        "raw numpy pack + ids",
        lambda r, a: ours(r, a.length, a.batch, "counted"),
    ),
    "ours pack w0, rank 0 of 4": (
        "raw numpy pack + ids",
        lambda r, a: ours(r, a.length, a.batch, "rank 0 of 4"),
    ),
    "ours pack w2": ("raw numpy pack + ids", lambda r, a: ours(r, a.length, a.batch, "w2")),
}


def cpu_seconds() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(name: str, root: Path, args: argparse.Namespace) -> dict[str, float]:
    import torch  # noqa: F401  (imports are not read time)

    import shardstream.loader.dataset
    import shardstream.loader.tokens.packing  # noqa: F401

    pa.array([0]).to_numpy()  # pyarrow's first to_numpy imports pandas (~0.2 s): not read time

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    first, count = None, 0
    for n in RUNS[name][1](root, args):
        if first is None:
            first = time.perf_counter() - t0
        count += n
    return {
        "seconds": time.perf_counter() - t0,
        "cpu_s": cpu_seconds() - cpu0,
        "tokens": count,
        "first_s": first or 0.0,
    }


def scale_len(shards: int = 1_000_000, docs: int = 8) -> dict[str, float]:
    """Seconds to load a saved index of `shards` shards with token counts and compute
    the blocks each of 4,096 ranks makes (what `len` needs)."""
    from shardstream.loader.index.shard_index import ShardIndex
    from shardstream.loader.tokens.lengths import document_lengths, lengths_column
    from shardstream.loader.tokens.pack import Pack
    from shardstream.sampler.packing import blocks_per_rank, dropped

    with tempfile.TemporaryDirectory() as d:
        n = shards * docs
        counts = np.random.default_rng(1).integers(10, 3000, n).astype(np.int32)
        offsets = np.arange(0, n + 1, docs, dtype=np.int64)
        table = pa.table(
            {
                "url": pa.array([f"s3://b/t/part-{i:07d}.parquet" for i in range(shards)]),
                "bytes": pa.array(np.full(shards, 1 << 20, dtype=np.int64)),
                "version": pa.array(["v"] * shards),
                "records": pa.array(np.full(shards, docs, dtype=np.int64)),
                lengths_column(COLUMN): pa.LargeListArray.from_arrays(
                    pa.array(offsets), pa.array(counts)
                ),
            }
        )
        path = Path(d) / "big.index.arrow"
        ShardIndex(table=table, format="parquet").save(path)
        t0 = time.perf_counter()
        index = ShardIndex.load(path)
        pack = Pack(COLUMN, 2049, eos=EOS)
        places = pack.places(document_lengths(index, None, COLUMN))  # type: ignore[arg-type]
        total = int(places.sum())
        n_blocks = blocks_per_rank(total, pack.length, 4096)
        seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "blocks_per_rank": n_blocks,
        "dropped": dropped(total, pack.length, 4096),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.tokens", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--length", type=int, default=2049)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, Path(args.data), args)))
        return
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        make_data(root, args.shards, args.docs)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in RUNS}
        steps = [(r, name) for r in range(args.rounds) for name in RUNS]
        for _, name in tqdm(steps, desc="runs", file=sys.stderr):
            cmd = [
                sys.executable,
                "-m",
                "scripts.bench.tokens",
                "--one",
                name,
                "--data",
                d,
                "--length",
                str(args.length),
                "--batch",
                str(args.batch),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        rows = []
        for name, (limit, _) in RUNS.items():
            med = {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
            rows.append({"run": name, "limit": limit, **med})
        by = {r["run"]: r for r in rows}
        for r in rows:
            r["tokens_per_s"] = r["tokens"] / r["seconds"]
            r["cpu_ns_per_token"] = 1e9 * r["cpu_s"] / r["tokens"]
            lim = by.get(r["limit"]) if r["limit"] else None
            r["x_limit"] = r["tokens_per_s"] / (lim["tokens"] / lim["seconds"]) if lim else None
            r["cpu_x_limit"] = (
                r["cpu_ns_per_token"] / (1e9 * lim["cpu_s"] / lim["tokens"]) if lim else None
            )
        scale = scale_len()
    if args.json:
        print(json.dumps({"rows": rows, "len_1m_shards": scale}))
        return
    print(
        f"{'run':28} {'Mtok/s':>8} {'x limit':>8} {'CPU ns/tok':>10} {'CPU x':>6} {'first ms':>9}"
    )
    for r in rows:
        x = f"{r['x_limit']:.2f}" if r["x_limit"] else "-"
        c = f"{r['cpu_x_limit']:.2f}" if r["cpu_x_limit"] else "-"
        print(
            f"{r['run']:28} {r['tokens_per_s'] / 1e6:8.1f} {x:>8} {r['cpu_ns_per_token']:10.2f} "
            f"{c:>6} {1e3 * r['first_s']:9.1f}"
        )
    print(
        f"len from a saved index of 1,000,000 shards (8 documents each), 4,096 ranks: "
        f"{scale['seconds']:.2f} s; {scale['blocks_per_rank']} blocks a rank, "
        f"{scale['dropped']} tokens dropped an epoch"
    )


if __name__ == "__main__":
    main()
