"""The Apache arrow-testing corpus (tests/data/corpora/arrow-testing, its SOURCES.md), each
file read by the loader in a child process against what pyarrow reads from the same bytes.

A case is one file on one backend in one mode (records, or batches of 7). Cases run in
child processes, many to a child (starting one costs a second of imports); the child
writes an event before each step, so that when it dies (a segmentation fault, an abort)
or hangs, the parent knows which case and which step did it, names that case, and goes on
with the rest in a fresh child. Run as a script for the table of outcomes:

    .venv/bin/python -m tests.arrow_corpus [--backend local] [--out results.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import lzma
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.corpora import CORPORA, batch_columns, batch_same, same

ROOT = CORPORA / "arrow-testing"
BATCH = 7  # batch mode's batch size: batches cut across record batches and row groups
CASE_LIMIT = 60.0  # seconds one case may run before it counts as a hang
PASSED = {"read", "refused"}


def shard_name(rel: str) -> str:
    """The shard name a corpus file is read under (the loader picks the format by suffix):
    Parquet files end in .parquet; IPC files in .arrow, the stream format marked."""
    folder, _, name = rel.rpartition("/")
    name = name.removesuffix(".xz")
    if name.endswith(".arrow_file"):
        name = name.removesuffix(".arrow_file") + ".file.arrow"
    elif name.endswith(".stream"):
        name = name.removesuffix(".stream") + ".stream.arrow"
    elif not name.endswith(".parquet"):
        name = name.removesuffix(".fuzz") + ".parquet"
    return f"{folder}/{name}"


def corpus_files() -> list[str]:
    """Every corpus file, as its shard name (`shard_name`)."""
    return sorted(
        shard_name(str(p.relative_to(ROOT)))
        for p in ROOT.rglob("*")
        if p.is_file() and p.name != "SOURCES.md"
    )


def unpack(dest: Path) -> dict[str, Path]:
    """Every corpus file under `dest` by its shard name (``.xz`` unpacked)."""
    out = {}
    for p in sorted(ROOT.rglob("*")):
        if not p.is_file() or p.name == "SOURCES.md":
            continue
        name = shard_name(str(p.relative_to(ROOT)))
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        data = p.read_bytes()
        target.write_bytes(lzma.decompress(data) if p.suffix == ".xz" else data)
        out[name] = target
    return out


def group_of(name: str) -> str:
    """The table's case group: the corpus folder (IPC: producer and format)."""
    folder = name.rsplit("/", 1)[0]
    if folder.startswith("ipc/"):
        return f"{folder} ({'stream' if name.endswith('.stream.arrow') else 'file'})"
    return folder


# ---- the child side ----------------------------------------------------------------------


def reference(path: Path) -> Any:
    """pyarrow's table of the file (its own readers, native byte order), or the error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        with pa.memory_map(str(path)) as source:
            if path.name.endswith(".file.arrow"):
                return pa.ipc.open_file(source).read_all()
            return pa.ipc.open_stream(source).read_all()
    except Exception as e:
        return e


def judge(case: dict[str, Any], want: Any) -> dict[str, Any]:
    """Read the case with the loader and compare with pyarrow's `want`."""
    import pyarrow as pa

    from shardstream.loader import ShardError, StreamingDataset

    url, batch = case["url"], case["batch"]
    readable = isinstance(want, pa.Table)
    out: dict[str, Any] = {"pyarrow": "reads" if readable else f"refuses ({want!r:.200})"}
    try:
        got = list(
            StreamingDataset(url, shuffle=False, storage_options=case["opts"], batch_size=batch)
        )
    except Exception as e:
        named = isinstance(e, ShardError) and url in str(e)
        text = f"{type(e).__name__}: {e}"[:600]
        return {**out, "outcome": "refused" if named else "bare", "error": text}
    if not readable:
        return {**out, "outcome": "wrong", "error": f"pyarrow refuses; we read {len(got)} items"}
    if batch is None:
        ok = same(got, want.to_pylist())
        if not ok:
            first = next(
                (i for i, (a, b) in enumerate(zip(got, want.to_pylist())) if not same(a, b)), None
            )
            detail = f"{len(got)} records for {want.num_rows}; first differing: {first}"
            if first is not None:
                detail += f": {str(got[first])[:200]} != {str(want.to_pylist()[first])[:200]}"
            return {**out, "outcome": "wrong", "error": detail}
        return {**out, "outcome": "read"}
    columns = batch_columns(got)
    cols = {c: want.column(i).to_pylist() for i, c in enumerate(want.column_names)}
    if sorted(columns) != sorted(cols) and want.num_rows:
        return {**out, "outcome": "wrong", "error": f"columns {sorted(columns)} != {sorted(cols)}"}
    for c, values in columns.items():
        if not batch_same(values, cols[c]):
            return {**out, "outcome": "wrong", "error": f"column {c} differs"}
    return {**out, "outcome": "read"}


def child(cases_file: str, events_file: str, skip: int) -> None:
    """Run cases[skip:], an event line before each step and one with each outcome."""
    cases = json.loads(Path(cases_file).read_text())
    with open(events_file, "a") as events:

        def event(**kw: Any) -> None:
            events.write(json.dumps(kw) + "\n")
            events.flush()

        for i, case in enumerate(cases[skip:], skip):
            event(i=i, step="pyarrow")
            want = reference(Path(case["path"])) if not case.get("pyarrow_dies") else None
            if want is None:
                want = RuntimeError("pyarrow's own reader dies on this file")
            event(i=i, step="ours")
            try:
                result = judge(case, want)
            except Exception:
                result = {"outcome": "bare", "error": traceback.format_exc()[-600:]}
            event(i=i, step="done", **result)


# ---- the parent side ---------------------------------------------------------------------


def run_cases(cases: list[dict[str, Any]], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every case's outcome by id, run in children that are replaced when one dies or
    hangs (that case is then "crash" or "hang", named with the step it was in)."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases_file, events_file = Path(tmp, "cases.json"), Path(tmp, "events.jsonl")
        cases_file.write_text(json.dumps(cases))
        start = 0
        while start < len(cases):
            events_file.write_text("")
            command = [sys.executable, "-m", "tests.arrow_corpus", "--child"]
            command += [str(cases_file), str(events_file), str(start)]
            proc = subprocess.Popen(
                command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
            )
            seen, last, moved = 0, None, time.monotonic()
            while proc.poll() is None and time.monotonic() - moved < CASE_LIMIT:
                time.sleep(0.05)
                lines = events_file.read_text().splitlines()
                if len(lines) != seen:
                    seen, moved = len(lines), time.monotonic()
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
            for line in events_file.read_text().splitlines():
                last = json.loads(line)
                if last["step"] == "done":
                    results[cases[last["i"]]["id"]] = last
            if proc.returncode == 0:
                break
            if last is None or last["step"] == "done":  # died between cases
                at = (last["i"] + 1) if last else start
                step = "startup"
            else:
                at, step = last["i"], last["step"]
            if step == "pyarrow" and not cases[at].get("pyarrow_dies"):
                cases[at]["pyarrow_dies"] = True  # not ours: run it again without pyarrow
                cases_file.write_text(json.dumps(cases))
                start = at
                continue
            hang = proc.returncode in (-9, 137)
            results[cases[at]["id"]] = {
                "outcome": "hang" if hang else "crash",
                "error": f"{step}: rc {proc.returncode}; {err.decode(errors='replace')[-400:]}",
            }
            start = at + 1
    return results


def make_cases(
    files: dict[str, Path], backends: dict[str, tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Cases of every file × backend × mode; `backends`: name -> (URL prefix, options)."""
    cases = []
    for backend, (prefix, opts) in backends.items():
        for name, path in files.items():
            for batch in (None, BATCH):
                mode = "batch" if batch else "record"
                url = str(path) if backend == "local" else f"{prefix}/{name}"
                cases.append(
                    {
                        "id": f"{backend}-{mode}-{name}",
                        "name": name,
                        "path": str(path),
                        "url": url,
                        "opts": opts,
                        "batch": batch,
                    }
                )
    return cases


@contextmanager
def s3_copy(files: dict[str, Path]) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """The files in bucket "arrow-testing" of a moto server of their own: (URL prefix,
    storage_options, environment with the test credentials)."""
    import s3fs

    from tests.conftest import moto_server

    keys = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with moto_server(keys) as endpoint:
        opts: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}}
        fs = s3fs.S3FileSystem(**opts, key="testing", secret="testing", skip_instance_cache=True)
        fs.mkdir("arrow-testing")
        fs.pipe({f"arrow-testing/{n}": p.read_bytes() for n, p in files.items()})
        yield "s3://arrow-testing", opts, keys


def table(results: dict[str, dict[str, Any]], cases: list[dict[str, Any]]) -> str:
    """Outcomes by case group, as a Markdown table."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case in cases:
        r = results.get(case["id"], {"outcome": "missing"})
        outcome = r["outcome"]
        if outcome == "refused" and r.get("pyarrow") == "reads":
            outcome = "refused (pyarrow reads)"
        counts[group_of(case["name"])][outcome] += 1
    kinds = ["read", "refused", "refused (pyarrow reads)", "wrong", "bare", "crash", "hang"]
    lines = ["| group | cases | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 2) + "|"]
    for group, c in sorted(counts.items()):
        lines.append(
            f"| {group} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in kinds) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--backend", action="append", choices=["local", "s3"])
    parser.add_argument("--only", default="", help="only files whose name holds this")
    parser.add_argument("--out", help="write every case's outcome here (JSON)")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    backends = args.backend or ["local", "s3"]
    with tempfile.TemporaryDirectory() as tmp:
        files = {n: p for n, p in unpack(Path(tmp)).items() if args.only in n}
        env = dict(os.environ)
        where: dict[str, tuple[str, dict[str, Any]]] = {"local": ("", {})}
        with s3_copy(files) if "s3" in backends else _nothing() as s3:
            if s3 is not None:
                where["s3"] = (s3[0], s3[1])
                env.update(s3[2])
            cases = make_cases(files, {b: where[b] for b in backends})
            results = run_cases(cases, env)
    print(table(results, cases))
    for case in cases:
        r = results.get(case["id"], {"outcome": "missing"})
        if r["outcome"] not in PASSED:
            print(f"{case['id']}: {r['outcome']}: {r.get('error', '')[:300]}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
