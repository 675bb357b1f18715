"""Benchmark of the writer (shardstream.write.write_shards) against the limits and LitData.

    .venv/bin/python -m scripts.bench.write [--quick] [--rounds 3]

Data, made once and reused under .cache/bench-write/ (--quick: .cache/bench-write/quick/):
8 Parquet files written by pandas, one row group each (int64 id, float64 score, a string
of 20-200 chars, a list<int32> of 0-30 values; 2M rows, ~380 MB), and 8 JSON Lines files
of English-like text (~75 MB; words from a fixed Zipf vocabulary, seeded), with an 8k BPE
trained on them (tokenizers' BpeTrainer, saved to tokenizer.json).

Each run in a fresh process, --rounds times interleaved (medians): wall seconds, records/s
(documents/s for the text), CPU seconds per record (the process and all its children:
getrusage SELF + CHILDREN), the ratios of records/s and of CPU per record to the reference
(the limit, or np=1 for the np=2 reshard), the peak RSS (ru_maxrss: the process / its
largest child, MB, and the process's size after imports) beside the input's size, and the
1-minute load when it started. The machine is shared: the footer gives loadavg and how many
CPUs two busy loops got, before and after (2.0: both free).

  reshard limit            one process: pq.read_table(file), pq.write_table(table, out)
  ours reshard np=1|2      write_shards(parquet_dir, dest, shard_bytes=source/8): >= 8
                           shards; np=1 >= 0.8x the limit, np=2 >= 1.6x np=1
  tokenize limit           pyarrow.json.read_json each file, tok.encode_batch per 1000
                           texts, same process, nothing written
  ours tokenize np=1|2     write_shards(jsonl_dir, dest, map=tokenize,
                           tokens_column="input_ids"): >= 0.9x the limit's documents/s
  litdata optimize w2|w1   litdata.optimize(fn: the file's texts read and encoded as
                           above, a tensor a document, item_loader=TokensLoader())

TOKENIZERS_PARALLELISM=true is set for every run (inherited by spawned children): each
encode_batch uses tokenizers' thread pool over the 2 cores, in the limit and in each writer
or LitData process alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson
import pyarrow.parquet as pq
from tqdm import tqdm

from scripts.bench import REPO

ROOT = REPO / ".cache" / "bench-write"
FILES = 8
TOKENIZER_ENV = "BENCH_WRITE_TOKENIZER"
SYLLABLES = "ka to ri an el mo su ne li ra de ve on is ta bo mi gu pe sa th er"
COMMON = "the of and to a in is that it for was on with as by at from this , . ,"
# name: (part, reference run, the ratio it must reach, the reference's name in the target)
RUNS: dict[str, tuple[str, str | None, float | None, str]] = {
    "reshard limit": ("reshard", None, None, ""),
    "ours reshard np=1": ("reshard", "reshard limit", 0.8, "limit"),
    "ours reshard np=2": ("reshard", "ours reshard np=1", 1.6, "np=1"),
    "tokenize limit": ("tokens", None, None, ""),
    "ours tokenize np=1": ("tokens", "tokenize limit", 0.9, "limit"),
    "ours tokenize np=2": ("tokens", "tokenize limit", 0.9, "limit"),
    "litdata optimize w2": ("tokens", "tokenize limit", None, "limit"),
    "litdata optimize w1": ("tokens", "tokenize limit", None, "limit"),
}

_TOKENIZER: Any = None  # this process's, loaded once


def tokenize(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The writer's map: texts -> input_ids (the tokenizer loaded once a process)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from tokenizers import Tokenizer

        _TOKENIZER = Tokenizer.from_file(os.environ[TOKENIZER_ENV])
    return {"input_ids": [e.ids for e in _TOKENIZER.encode_batch(batch["text"])]}


def litdata_tokenize(path: str) -> Any:
    """LitData's fn: one JSON Lines file's documents, a token tensor each."""
    import torch

    table = pjson.read_json(path)
    for lo in range(0, table.num_rows, 1000):
        texts = table.column("text").slice(lo, 1000).to_pylist()
        for ids in tokenize({"text": texts})["input_ids"]:
            yield torch.tensor(ids, dtype=torch.int32)


# ----------------------------------------------------------------------------- data
def make_parquet(root: Path, rows: int) -> Path:
    folder, done = root / "parquet", root / "parquet.done"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    ", np.uint8)
    per = rows // FILES
    for k in tqdm(range(FILES), desc="parquet data", file=sys.stderr, leave=False):
        lengths = rng.integers(20, 201, per)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        chars = alphabet[rng.integers(0, alphabet.size, int(offsets[-1]), dtype=np.uint8)]
        text = pa.StringArray.from_buffers(per, pa.py_buffer(offsets), pa.py_buffer(chars))
        counts = rng.integers(0, 31, per)
        loffsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        values = rng.integers(0, 1 << 20, int(loffsets[-1]), dtype=np.int32)
        table = pa.table(
            {
                "id": np.arange(k * per, (k + 1) * per, dtype=np.int64),
                "score": rng.random(per),
                "text": text,
                "values": pa.ListArray.from_arrays(pa.array(loffsets), pa.array(values)),
            }
        )
        table.to_pandas().to_parquet(folder / f"part-{k:02d}.parquet", index=False)
    assert all(pq.ParquetFile(f).num_row_groups == 1 for f in folder.iterdir())
    done.touch()
    return folder


def make_text(root: Path, megabytes: int) -> tuple[Path, int]:
    """(folder, documents): JSON Lines of Zipf words; the tokenizer trained on them."""
    folder, done = root / "jsonl", root / "jsonl.json"
    if done.exists():
        return folder, json.loads(done.read_text())["documents"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    syllables = re.findall(r"\S+", SYLLABLES)
    common = re.findall(r"\S+", COMMON)
    rare = {"".join(rng.choice(syllables, rng.integers(1, 5))) for _ in range(30_000)}
    vocab = np.array(common + sorted(rare))
    p = 1.0 / (np.arange(vocab.size) + 2.7)
    p /= p.sum()
    docs, per_file = 0, megabytes * 1_000_000 // FILES
    for k in tqdm(range(FILES), desc="text data", file=sys.stderr, leave=False):
        written = 0
        with open(folder / f"part-{k:02d}.jsonl", "w") as f:
            while written < per_file:
                lengths = np.clip(rng.lognormal(5.3, 0.8, 1000), 20, 3000).astype(int)
                words = vocab[rng.choice(vocab.size, int(lengths.sum()), p=p)].tolist()
                at = 0
                for n in lengths:
                    text = " ".join(words[at : at + n]).replace(" ,", ",").replace(" .", ".")
                    at += n
                    line = json.dumps({"text": text.capitalize()}) + "\n"
                    written += len(line)
                    docs += 1
                    f.write(line)
    train_tokenizer(folder, root / "tokenizer.json")
    done.write_text(json.dumps({"documents": docs}))
    return folder, docs


def train_tokenizer(folder: Path, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    texts = (t for f in sorted(folder.glob("*.jsonl")) for t in _texts(f))
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def _texts(path: Path) -> Any:
    column = pjson.read_json(path).column("text")
    for lo in range(0, len(column), 1000):
        yield from column.slice(lo, 1000).to_pylist()


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


# ----------------------------------------------------------------------------- one run
def cpu_seconds() -> float:
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(name: str, root: Path, out: Path) -> dict[str, Any]:
    """Records done by run `name` (its output under `out`) and what it reports."""
    parquet, jsonl = root / "parquet", root / "jsonl"
    if name == "reshard limit":
        records = 0
        for i, f in enumerate(sorted(parquet.iterdir())):
            table = pq.read_table(f)
            pq.write_table(table, out / f"{i}.parquet")
            records += table.num_rows
        return {"records": records}
    if name.startswith("ours"):
        from shardstream.write import write_shards

        np_ = int(name[-1])
        if "reshard" in name:
            kw: dict[str, Any] = {"shard_bytes": folder_bytes(parquet) // FILES}
            src = parquet
        else:  # the ids' Parquet is ~ text bytes / 4: >= 8 shards
            kw = {"shard_bytes": folder_bytes(jsonl) // 32, "map": tokenize}
            kw["tokens_column"] = "input_ids"
            src = jsonl
        s = write_shards(str(src), str(out / "dest"), num_proc=np_, **kw)
        return {"records": s.records, "shards": s.shards}
    if name == "tokenize limit":
        docs = 0
        for f in sorted(jsonl.iterdir()):
            column = pjson.read_json(f).column("text")
            for lo in range(0, len(column), 1000):
                docs += len(tokenize({"text": column.slice(lo, 1000).to_pylist()})["input_ids"])
        return {"records": docs}
    from litdata import TokensLoader, optimize

    optimize(
        fn=litdata_tokenize,
        inputs=[str(f) for f in sorted(jsonl.iterdir())],
        output_dir=str(out / "litdata"),
        chunk_bytes=folder_bytes(jsonl) // 32,
        item_loader=TokensLoader(),
        num_workers=int(name[-1]),
    )
    index = json.loads((out / "litdata" / "index.json").read_text())
    return {"records": None, "shards": len(index["chunks"])}


def measure(name: str, root: Path) -> dict[str, Any]:
    import shardstream.write  # noqa: F401  (imports are not write time)

    if name.startswith("litdata"):
        import litdata  # noqa: F401
    load, base = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory(dir=root) as d:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        got = run(name, root, Path(d))
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return {
        **got,
        "seconds": seconds,
        "cpu_s": cpu,
        "rss_self_mb": me.ru_maxrss / 1024,
        "rss_child_mb": kids.ru_maxrss / 1024,
        "rss_base_mb": base / 1024,
        "load": load,
    }


# ----------------------------------------------------------------------------- the table
def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.write", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="200k rows, 8 MB of text, 1 round")
    p.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    p.add_argument("--only", nargs="*", default=None, help="these runs only")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    if args.one:
        os.environ[TOKENIZER_ENV] = str(Path(args.data) / "tokenizer.json")
        # the functions as scripts.bench.write's, not __main__'s (what spawned children import)
        from scripts.bench import write as me

        print(json.dumps(me.measure(args.one, Path(args.data))))
        return
    root = ROOT / "quick" if args.quick else ROOT
    rounds = args.rounds or (1 if args.quick else 3)
    t0 = time.perf_counter()
    parquet = make_parquet(root, 200_000 if args.quick else 2_000_000)
    jsonl, docs = make_text(root, 8 if args.quick else 75)
    print(f"data ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    sizes = {"reshard": folder_bytes(parquet) / 1e6, "tokens": folder_bytes(jsonl) / 1e6}
    for f in [*parquet.iterdir(), *jsonl.iterdir()]:  # in the page cache for every run
        f.read_bytes()
    names = [n for n in RUNS if args.only is None or n in args.only]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    load_before, aborts, free_before = os.getloadavg(), 0, free_cores()
    for _, name in tqdm([(r, n) for r in range(rounds) for n in names], desc="runs"):
        if name in errors:
            continue
        cmd = [sys.executable, "-m", "scripts.bench.write", "--one", name, "--data", str(root)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        aborts += out.stderr.count("terminate called")  # a child's C++ abort at exit
        if out.returncode:
            errors[name] = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "?"
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        got["records"] = got["records"] or docs
        results[name].append(got)
    load_after, free_after = os.getloadavg(), free_cores()
    table(names, results, errors, sizes)
    print(
        f"{rounds} round(s), medians; x ref: records/s over the reference's (the target's), "
        f"CPU x: CPU per record over its; RSS: ru_maxrss of the process (its size after "
        f"imports) / its largest child. loadavg before {_load(load_before)}, after "
        f"{_load(load_after)} on {os.cpu_count()} CPUs; free CPUs (2 busy loops' rate over "
        f"1's) before {free_before:.2f}, after {free_after:.2f}; TOKENIZERS_PARALLELISM=true"
        + (f"; {aborts} child process(es) printed 'terminate called'" if aborts else "")
    )


def free_cores() -> float:
    """About how many CPUs are free now: two busy loops' rate over one loop's (2: two)."""

    def loops(n: int) -> float:
        t0 = time.perf_counter()
        code = "sum(range(20_000_000))"
        for proc in [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]:
            proc.wait()
        return time.perf_counter() - t0

    one = loops(1)
    return 2 * one / loops(2)


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def table(names: list[str], results: dict, errors: dict[str, str], sizes: dict) -> None:
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        if results[name]:
            got = results[name]
            rows[name] = {k: statistics.median(r[k] for r in got) for k in got[0]}
            rows[name]["rate"] = rows[name]["records"] / rows[name]["seconds"]
            rows[name]["cpu_rec"] = rows[name]["cpu_s"] / rows[name]["records"]
    print(
        f"{'run':27} {'records':>9} {'wall s':>6} {'rec/s':>9} {'CPU us/rec':>10} "
        f"{'x ref':>5} {'CPU x':>5}  {'target':22} {'RSS MB (base)':>15} {'data MB':>7} {'load':>4}"
    )
    for name in names:
        part, ref, want, ref_name = RUNS[name]
        if name not in rows:
            print(f"{name:27} not run: {errors.get(name, 'no result')}")
            continue
        r = rows[name]
        x = c = None
        if ref in rows:
            x, c = r["rate"] / rows[ref]["rate"], r["cpu_rec"] / rows[ref]["cpu_rec"]
        target = f"(vs {ref_name})" if ref_name else ""
        if want is not None:
            verdict = "-" if x is None else ("met" if x >= want else "MISSED")
            target = f">={want}x {ref_name}: {verdict}"
        label = name + (f" ({int(r['shards'])} sh)" if "shards" in r else "")
        rss = f"{r['rss_self_mb']:.0f}/{r['rss_child_mb']:.0f} ({r['rss_base_mb']:.0f})"
        xs = "    -     -" if x is None else f"{x:5.2f} {c:5.2f}"
        print(
            f"{label:27} {int(r['records']):>9,} {r['seconds']:6.2f} {r['rate']:9,.0f} "
            f"{1e6 * r['cpu_rec']:10.2f} {xs}  {target:22} {rss:>15} {sizes[part]:7.0f} "
            f"{r['load']:4.1f}"
        )


if __name__ == "__main__":
    main()
