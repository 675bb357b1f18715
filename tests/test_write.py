"""shardstream.write_shards and shardstream-write: what users have, rewritten into shards
laid out for their job, read back record for record (every column) against what pyarrow
and webdataset read from the same source; real processes, a real S3 endpoint (moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from torch.utils.data import DataLoader

from shardstream import StreamingDataset
from shardstream.loader.index.beside import INDEX_NAME
from shardstream.write import write_shards
from tests.rowdata import rows_of, same
from tests.s3proxy import counting_proxy
from tests.write_maps import KILL_AT, char_tokens, kill_at, words

REPO = Path(__file__).resolve().parents[1]


def _pandas_source(root: Path, n: int = 30_000, files: int = 3) -> pa.Table:
    """Files as pandas writes them (one row group each), of several column types; the
    table pyarrow.dataset reads from them."""
    rng = np.random.default_rng(7)
    df = pd.DataFrame(
        {
            "id": np.arange(n),
            "x": np.where(rng.random(n) < 0.1, np.nan, rng.random(n)),
            "text": [f"document {i} " + "word " * (i % 17) for i in range(n)],
            "tags": [[f"t{j}" for j in range(i % 4)] for i in range(n)],
            "when": pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(n), unit="s"),
            "flag": pd.array([None if i % 7 == 0 else i % 2 == 0 for i in range(n)], "boolean"),
        }
    )
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        df.iloc[f * n // files : (f + 1) * n // files].to_parquet(root / f"data-{f}.parquet")
    return pads.dataset(str(root), format="parquet").to_table()


def _by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        assert int(row["id"]) not in out, f"record {row['id']} read twice"
        out[int(row["id"])] = row
    return out


def _same_records(got: list[dict[str, Any]], want: pa.Table) -> None:
    expected = _by_id(want.to_pylist())
    read = _by_id(got)
    assert read.keys() == expected.keys()
    for i, row in expected.items():
        assert read[i].keys() == row.keys()
        assert all(same(read[i][k], row[k]) for k in row), (read[i], row)


def _plan(source: str, ranks: int, workers: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "shardstream.plan", source, "--world-size", str(ranks),
         "--workers", str(workers), "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _shards(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dest.glob("part-*.parquet"))}


def test_a_pandas_dataset_rewritten_for_4_ranks_x_2_workers(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    want = _pandas_source(src)
    planned = _plan(str(src), 4, 2)
    before = planned["read_amplification"]
    assert before > 1.5  # one row group a file: workers read each other's records
    # the planner's advice is the command that writes the layout: run it as it says
    command = planned["advice"]["command"]
    assert command == f"shardstream-write {src} DEST --world-size 4 --workers 2"
    argv = command.replace("DEST", str(dest)).split()[1:]
    done = subprocess.run(
        [sys.executable, "-m", "shardstream.write", *argv, "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{want.num_rows:,} records" in done.stdout and "worst reader 1.0" in done.stdout
    after = _plan(str(dest), 4, 2)["read_amplification"]
    assert after <= 1.25, (before, after)
    # every rank of the job, through DataLoader's 2 workers: every record once, whole
    got: list[dict[str, Any]] = []
    for rank in range(4):
        ds = StreamingDataset(str(dest), num_replicas=4, rank=rank, seed=3)
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        got += [row for item in loader for row in rows_of(item, batch=False)]
    _same_records(got, want)
    # pandas' metadata of the source (its index of each file) is not carried over
    assert b"pandas" not in (pq.read_schema(dest / "part-00000.parquet").metadata or {})
    # the index beside the shards is what the dataset starts from
    assert (dest / INDEX_NAME).is_file()
    assert StreamingDataset(str(dest)).index.shards[0].url == f"{dest}/part-00000.parquet"


def test_map_in_two_processes_writes_the_shards_one_process_writes(tmp_path: Path) -> None:
    src = tmp_path / "text"
    src.mkdir()
    docs = [{"id": i, "text": ("skip " if i % 11 == 0 else "") + "a b c " * (i % 5)}
            for i in range(3000)]  # fmt: skip
    for f in range(3):
        with open(src / f"part-{f}.jsonl", "w") as out:
            for d in docs[f * 1000 : (f + 1) * 1000]:
                out.write(json.dumps(d) + "\n")
    one, two = tmp_path / "one", tmp_path / "two"
    args: dict[str, Any] = {"map": words, "batch_size": 128, "shard_bytes": 8_000}
    s1 = write_shards(str(src), str(one), num_proc=1, **args)
    s2 = write_shards(str(src), str(two), num_proc=2, **args)
    assert s1.shards == s2.shards > 2
    assert _shards(one) == _shards(two)  # byte for byte, whatever num_proc
    want = [
        {"doc": d["id"], "word": w, "position": i}
        for d in docs
        if "skip" not in d["text"]
        for i, w in enumerate(d["text"].split())
    ]
    got = [r for r in StreamingDataset(str(two), shuffle=False)]
    assert got == want  # in source order, every record once


def test_a_sigkilled_write_resumes_without_loss_duplicates_or_rewrites(tmp_path: Path) -> None:
    src, dest, whole = tmp_path / "src", tmp_path / "dest", tmp_path / "whole"
    want = _pandas_source(src, n=20_000)
    args = {"map": kill_at, "shard_bytes": 40_000, "row_group_rows": 500}
    script = (
        "import sys; from shardstream.write import write_shards; "
        "from tests.write_maps import kill_at; "
        f"write_shards({str(src)!r}, {str(dest)!r}, map=kill_at, shard_bytes=40_000, "
        "row_group_rows=500)"
    )
    env = {**os.environ, KILL_AT: "15000", "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", script], env=env, timeout=300)
    assert killed.returncode == -9
    kept = {p.name: p.stat() for p in dest.glob("part-*.parquet")}
    assert kept, "no shard was whole when the write was killed"
    for p in dest.glob("part-*.parquet"):  # each visible shard is whole
        pq.read_table(p)
    summary = write_shards(str(src), str(dest), **args)  # type: ignore[arg-type]
    assert summary.written == summary.shards - len(kept)
    for name, st in kept.items():  # not rewritten
        now = (dest / name).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    write_shards(str(src), str(whole), **args)  # type: ignore[arg-type]
    assert _shards(dest) == _shards(whole)
    assert not [p for p in dest.iterdir() if p.name.endswith(".tmp")]
    got = [row for item in StreamingDataset(str(dest)) for row in rows_of(item, batch=False)]
    _same_records(got, want)


def test_a_killed_writer_process_is_an_error_and_the_write_resumes(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    want = _pandas_source(src, n=12_000)
    args = {"map": kill_at, "shard_bytes": 40_000, "num_proc": 2}
    os.environ[KILL_AT] = "9000"
    try:
        with pytest.raises(RuntimeError, match=r"a writing process of .* died"):
            write_shards(str(src), str(dest), **args)  # type: ignore[arg-type]
    finally:
        del os.environ[KILL_AT]
    write_shards(str(src), str(dest), **args)  # type: ignore[arg-type]
    got = [row for item in StreamingDataset(str(dest)) for row in rows_of(item, batch=False)]
    _same_records(got, want)


def test_a_write_to_s3_is_read_from_its_index(s3: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    want = _pandas_source(src, n=9_000)
    s3.fs().mkdir("out")
    summary = write_shards(
        str(src), "s3://out/d", world_size=2, workers=2, shard_bytes=100_000,
        storage_options=s3.storage_options, num_proc=2,
    )  # fmt: skip
    assert summary.shards > 2
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset("s3://out/d", storage_options=opts)
        started = list(proxy.requests)
        got = [row for item in ds for row in rows_of(item, batch=False)]
    # no build's listing: at most the page sent beside the look for the index, dropped
    assert len([p for m, p, _ in started if "list-type" in p]) <= 1
    assert not [p for m, p, _ in started if ".parquet" in p]  # no footer read
    assert len(started) <= 4  # the index: found, then read; that listing page
    _same_records(got, want)


def test_bad_input_names_the_file_and_leaves_nothing_partial(tmp_path: Path) -> None:
    src, dest = tmp_path / "text", tmp_path / "dest"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(100)))
    (src / "b.jsonl").write_text('{"id": 1}\n{"id": 2, oops\n')
    with pytest.raises(ValueError, match=r"b\.jsonl: not readable as JSON Lines"):
        write_shards(str(src), str(dest))
    assert not [p for p in dest.glob("*") if not p.name.startswith("_")] if dest.exists() else True


def test_a_failing_map_leaves_no_object_and_no_upload_on_s3(s3: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _pandas_source(src, n=12_000)  # the failure is past the layout's sample (8,192)
    fs = s3.fs()
    fs.mkdir("bad")

    with pytest.raises(ValueError, match=r"map failed on .*data-2\.parquet \(its record \d+\)"):
        write_shards(
            str(src), "s3://bad/d", map=_fails_at_10500, shard_bytes=20_000, row_group_rows=100,
            storage_options=s3.storage_options,
        )  # fmt: skip
    names = [p.rsplit("/", 1)[-1] for p in fs.ls("bad/d")]
    shards = sorted(n for n in names if n.startswith("part-"))
    for name in shards:  # the shards before the failure: whole
        with fs.open(f"bad/d/{name}", "rb") as f:
            pq.read_table(f)
    assert INDEX_NAME not in names
    uploads = fs.call_s3("list_multipart_uploads", Bucket="bad")
    assert not uploads.get("Uploads")


def _fails_at_10500(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    if 10_500 in batch["id"]:
        raise RuntimeError("bad record 10500")
    return batch


def test_records_in_memory_and_tar_shards(tmp_path: Path) -> None:
    rows = [{"id": i, "name": f"n{i}", "v": [i, i + 1]} for i in range(5000)]
    write_shards(iter(rows), str(tmp_path / "it"), row_group_rows=700)
    ordered = StreamingDataset(str(tmp_path / "it"), shuffle=False)
    assert [row for x in ordered for row in rows_of(x, False)] == rows
    assert not (tmp_path / "it" / "_input").exists()  # the spill is gone
    df = pd.DataFrame(rows)
    write_shards(df, str(tmp_path / "df"))
    got = [row for x in StreamingDataset(str(tmp_path / "df")) for row in rows_of(x, False)]
    _same_records(got, pa.Table.from_pandas(df, preserve_index=False))
    # tar shards written by webdataset's TarWriter: a column an extension, bytes as stored
    (tmp_path / "tar").mkdir()
    for f in range(2):
        with wds.TarWriter(str(tmp_path / "tar" / f"s-{f}.tar")) as w:
            for i in range(f * 50, f * 50 + 50):
                w.write({"__key__": f"{i:05d}", "txt": f"text {i}", "cls": str(i % 3)})
    write_shards(str(tmp_path / "tar"), str(tmp_path / "tar_out"))
    want = {
        s["__key__"]: {"__key__": s["__key__"], "cls": s["cls"], "txt": s["txt"]}
        for s in wds.WebDataset(str(tmp_path / "tar" / "s-{0..1}.tar"), shardshuffle=False)
    }
    got_tar = pq.read_table(tmp_path / "tar_out").to_pylist()
    assert {r["__key__"]: r for r in got_tar} == want


def test_token_counts_are_kept_in_the_index(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": "x" * (i % 40)}) + "\n" for i in range(2000)))
    write_shards(str(src), str(tmp_path / "tok"), map=char_tokens, tokens_column="input_ids",
                 shard_bytes=5_000)  # fmt: skip
    index = StreamingDataset(str(tmp_path / "tok")).index
    kept = index.table.column("tokens:input_ids").combine_chunks().flatten().to_pylist()
    assert kept == [i % 40 + 1 for i in range(2000)]


def test_the_command_writes_and_says_what_it_wrote(tmp_path: Path) -> None:
    src = tmp_path / "src"
    want = _pandas_source(src, n=5_000)
    done = subprocess.run(
        [sys.executable, "-m", "shardstream.write", str(src), str(tmp_path / "out"),
         "--world-size", "2", "--workers", "2", "--shard-bytes", "50kB", "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("wrote ") and "5,000 records" in last
    got = [row for x in StreamingDataset(str(tmp_path / "out")) for row in rows_of(x, False)]
    _same_records(got, want)
    bad = subprocess.run(
        [sys.executable, "-m", "shardstream.write", str(tmp_path / "nothing"), str(tmp_path / "o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 1 and "nothing" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_every_option_has_a_row_in_the_writing_doc_and_a_flag() -> None:
    import inspect

    from shardstream.write.cli import parse_args

    doc = (REPO / "docs" / "writing.md").read_text()
    names = list(inspect.signature(write_shards).parameters)[2:]
    assert [n for n in names if f"`{n}`" not in doc] == []
    flags = vars(parse_args(["a", "b"]))
    assert {n for n in names if n not in ("map", "progress")} <= set(flags)
    assert {"map", "quiet"} <= set(flags)


def test_under_torchrun_every_rank_starts_from_the_written_index(tmp_path: Path) -> None:
    import hashlib

    from shardstream.loader.index.shard_index import ShardIndex
    from tests.conftest import torchrun

    src, dest = tmp_path / "src", tmp_path / "dest"
    _pandas_source(src, n=3_000)
    write_shards(str(src), str(dest), shard_bytes=20_000)
    listed = ShardIndex.build(str(dest))  # what listing the folder and its footers gives
    out = torchrun(REPO / "tests" / "dist" / "build_index.py", "null", json.dumps(str(dest)))
    results = [json.loads(o.split("RESULT ", 1)[1].splitlines()[0]) for o in out]
    want = hashlib.sha256(json.dumps(listed.to_json(), sort_keys=True).encode()).hexdigest()
    assert [r.get("digest") for r in results] == [want, want], results
    assert [r["fetched"] for r in results] == [0, 0]  # no shard's byte read to start


def test_a_rewritten_shard_is_stale_and_a_copied_folder_reads(tmp_path: Path) -> None:
    import shutil

    from shardstream import StaleIndexError

    src, dest = tmp_path / "src", tmp_path / "dest"
    want = _pandas_source(src, n=3_000)
    write_shards(str(src), str(dest), shard_bytes=20_000)
    shutil.copytree(dest, tmp_path / "copy")  # new modification times and inodes
    got = [row for x in StreamingDataset(str(tmp_path / "copy")) for row in rows_of(x, False)]
    _same_records(got, want)
    shard = dest / "part-00001.parquet"
    pq.write_table(pq.read_table(shard), shard)  # the same rows, written again
    with pytest.raises(StaleIndexError, match=r"part-00001\.parquet"):
        list(StreamingDataset(str(dest)))
