"""Files written by other tools (pandas, polars, duckdb, fastparquet, HF datasets, Spark's
layout, webdataset's TarWriter, GNU tar): read as pyarrow.dataset and webdataset read them,
or refused with an error naming the file."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch

from shardstream.loader import ShardError, ShardIndex, StreamingDataset


def rows_of(ds: Any) -> list[tuple[Any, ...]]:
    """Records as sorted tuples of (column, value) pairs: order-free comparison."""
    return sorted(tuple(sorted(r.items())) for r in ds)


def pyarrow_rows(path: Path, **kw: Any) -> list[tuple[Any, ...]]:
    return rows_of(pads.dataset(str(path), **kw).to_table().to_pylist())


# ------------------------------------------------------------------ Hive trees ---------
def test_polars_partition_by_matches_pyarrow_dataset(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars")
    df = pl.DataFrame(
        {"year": [2023, 2024, 2024, 2024], "month": [1, 1, 2, 2], "v": [0.5, 1.5, 2.5, 3.5]}
    )
    df.write_parquet(tmp_path / "t", partition_by=["year", "month"])
    # polars keeps the keys inside the files as well: those columns win, as polars' own
    # hive reader has it (pyarrow.dataset with partitioning="hive" refuses the tree)
    want = pyarrow_rows(tmp_path / "t")
    assert rows_of(StreamingDataset(str(tmp_path / "t"))) == want
    assert {k for k, _ in want[0]} == {"year", "month", "v"}  # the check sees the keys
    assert want == rows_of(
        pl.scan_parquet(tmp_path / "t", hive_partitioning=True).collect().to_dicts()
    )


def test_duckdb_partition_by_columns_and_batches(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    duckdb.sql(
        "COPY (SELECT i AS id, i % 3 AS bucket, 'k' || (i % 2) AS kind FROM range(60) t(i)) "
        f"TO '{tmp_path / 'd'}' (FORMAT PARQUET, PARTITION_BY (bucket, kind))"
    )
    want = pyarrow_rows(tmp_path / "d", partitioning="hive")
    assert rows_of(StreamingDataset(str(tmp_path / "d"))) == want
    ds = StreamingDataset(str(tmp_path / "d"), columns=["id", "bucket", "kind"], batch_size=16)
    batches = list(ds)
    assert all(isinstance(b["bucket"], torch.Tensor) for b in batches)  # int32 partition
    assert all(isinstance(b["kind"], list) for b in batches)  # a string partition
    got = sorted(
        (i, b, k)
        for batch in batches
        for i, b, k in zip(batch["id"].tolist(), batch["bucket"].tolist(), batch["kind"])
    )
    assert got == [(i, i % 3, f"k{i % 2}") for i in range(60)]
    assert sorted(r["bucket"] for r in StreamingDataset(str(tmp_path / "d"), columns=["bucket"]))


def test_pandas_partition_cols(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"id": range(10), "part": ["a b", "c/d"] * 5})  # URI-encoded folders
    df.to_parquet(tmp_path / "p", partition_cols=["part"])
    assert rows_of(StreamingDataset(str(tmp_path / "p"))) == pyarrow_rows(
        tmp_path / "p", partitioning="hive"
    )


def _spark_like_tree(root: Path) -> None:
    """What a Spark job leaves: data files, _SUCCESS, .crc files and an aborted attempt's
    _temporary/ folder holding a copy of the data (Spark itself needs a JVM; its layout is
    written here file by file, with Parquet files from pyarrow)."""
    for d in ("year=2024", "year=2025"):
        (root / d).mkdir(parents=True)
        name = "part-00000-5e1f.c000.snappy.parquet"
        year = int(d.split("=")[1])
        pq.write_table(pa.table({"id": np.arange(100) + year * 1000}), root / d / name)
        (root / d / f".{name}.crc").write_bytes(b"crc")
        tmp = root / "_temporary" / "0" / "_temporary" / "attempt_1" / d
        tmp.mkdir(parents=True)
        shutil.copy(root / d / name, tmp / name)
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".hidden.parquet").write_bytes((root / d / name).read_bytes()[:60])


def test_spark_leftovers_are_not_data(tmp_path: Path) -> None:
    _spark_like_tree(tmp_path / "s")
    want = pyarrow_rows(tmp_path / "s", partitioning="hive")
    assert len(want) == 200
    got = rows_of(StreamingDataset(str(tmp_path / "s")))
    assert got == want  # not 260 (the _temporary copy), no .crc, no hidden file


# ------------------------------------------------------------------ suffixes -----------
def test_parq_and_pq_are_parquet(tmp_path: Path) -> None:
    for name, first in (("a.parquet", 0), ("b.parq", 10), ("c.pq", 20)):
        pq.write_table(pa.table({"id": range(first, first + 10)}), tmp_path / name)
    assert sorted(r["id"] for r in StreamingDataset(str(tmp_path))) == list(range(30))


def test_other_files_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    for name in ("b.csv", "c.npy", "d.tar.zst"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "train.index.json").write_text("{}")  # a saved index: no warning
    with caplog.at_level(logging.WARNING, logger="shardstream.loader"):
        ShardIndex.build(str(tmp_path))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "skipped 3 file(s) that are not shards" in warning
    assert "b.csv" in warning and "d.tar.zst" in warning and "index.json" not in warning


def _webdataset_tars(root: Path, compress: bool) -> None:
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    suffixes = [".tar", ".tar.gz" if compress else ".tar", ".tgz" if compress else ".tar"]
    for k, suffix in enumerate(suffixes):
        with wds.TarWriter(str(root / f"shard-{k}{suffix}"), compress=suffix != ".tar") as w:
            for i in range(20):
                n = k * 20 + i
                w.write({"__key__": f"s{n:04d}", "cls": str(n), "txt": f"text {n}" * 30})


def _webdataset_samples(urls: list[str]) -> list[tuple[Any, ...]]:
    import webdataset as wds

    got = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    return sorted((s["__key__"], s["__url__"], s["cls"], s["txt"]) for s in got)


def test_tar_gz_and_tgz_next_to_tar_match_webdataset(tmp_path: Path) -> None:
    _webdataset_tars(tmp_path / "w", compress=True)
    index = ShardIndex.build(str(tmp_path / "w"))
    assert index.shard_sizes.tolist() == [20, 20, 20]  # not 40 of 60
    urls = [s.url for s in index.shards]
    ours = sorted(
        (r["__key__"], r["__url__"], r["cls"], r["txt"])
        for r in StreamingDataset(index, num_replicas=3, rank=0, shuffle=True)
    ) + sorted(
        (r["__key__"], r["__url__"], r["cls"], r["txt"])
        for rank in (1, 2)
        for r in StreamingDataset(index, num_replicas=3, rank=rank, shuffle=True)
    )
    assert sorted(ours) == _webdataset_samples(urls)


def test_a_compressed_shard_costs_its_prefix(tmp_path: Path) -> None:
    _webdataset_tars(tmp_path / "w", compress=True)
    index = ShardIndex.build(str(tmp_path / "w"))
    gz = next(i for i, s in enumerate(index.shards) if s.url.endswith(".tar.gz"))
    shard = index.shards[gz]
    first, last = index.bytes_for(gz, 0, 1), index.bytes_for(gz, 19, 20)
    assert 0 < first <= last <= shard.bytes  # reading the last record decompresses them all
    assert index.bytes_for(gz, 10, 20) == last  # a piece's cost runs from the shard's start


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
def test_gnu_tar_czf_matches_webdataset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.cls").write_text(str(i))
        (src / f"{i:03d}.json").write_text(f'{{"i": {i}}}')
    names = sorted(p.name for p in src.iterdir())
    (tmp_path / "d").mkdir()
    subprocess.run(["tar", "-czf", str(tmp_path / "d" / "a.tgz"), *names], cwd=src, check=True)
    subprocess.run(["tar", "-cf", str(tmp_path / "d" / "b.tar"), *names], cwd=src, check=True)
    ours = sorted(
        (r["__key__"], r["__url__"], r["cls"]) for r in StreamingDataset(str(tmp_path / "d"))
    )
    import webdataset as wds

    urls = [str(tmp_path / "d" / "a.tgz"), str(tmp_path / "d" / "b.tar")]
    theirs = sorted(
        (s["__key__"], s["__url__"], s["cls"])
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    )
    assert ours == theirs and len(ours) == 60


def test_truncated_tgz_is_named(tmp_path: Path) -> None:
    _webdataset_tars(tmp_path / "w", compress=True)
    path = tmp_path / "w" / "shard-1.tar.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ShardError, match=r"shard-1.tar.gz: corrupt or truncated"):
        ShardIndex.build(str(tmp_path / "w"))


def test_url_is_given_as_the_user_gave_it(tmp_path: Path, monkeypatch: Any) -> None:
    _webdataset_tars(tmp_path / "w", compress=False)
    monkeypatch.chdir(tmp_path)
    for source in ("w", "w/", str(tmp_path / "w"), "w/shard-1.tar", "w/*.tar"):
        got = {r["__url__"] for r in StreamingDataset(source)}
        shards = ["w/shard-1.tar"] if source == "w/shard-1.tar" else sorted(got)
        assert got == set(shards)
        assert all("file://" not in u for u in got)
        prefix = str(tmp_path / "w") if source.startswith("/") else "w"
        assert all(u.startswith(prefix + "/shard-") for u in got)
    # webdataset gives the same string for the same URL
    assert {s["__url__"] for s in _webdataset_raw(["w/shard-0.tar"])} == {"w/shard-0.tar"}


def _webdataset_raw(urls: list[str]) -> list[dict[str, Any]]:
    import webdataset as wds

    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


# ------------------------------------------------------------------ duplicates ---------
def test_duplicate_member_in_a_sample_is_refused_as_webdataset_does(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("a.txt", b"1"), ("a.cls", b"2"), ("a.txt", b"3"), ("b.txt", b"4")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (tmp_path / "d.tar").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="duplicate file name"):
        _webdataset_raw([str(tmp_path / "d.tar")])
    with pytest.raises(ShardError, match=r"d.tar: duplicate file name.*sample 'a'.*'txt'"):
        ShardIndex.build(str(tmp_path))
