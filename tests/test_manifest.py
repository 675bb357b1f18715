"""Manifests as sources: shards with sizes (and record counts) named in a text or Parquet
file; a job starts without listing, and without reading footers where counts are given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.errors import StaleSidecarError
from shardstream.loader.formats.parquet.meta import SCANS
from tests.s3proxy import counting_proxy

from .datagen import SIZES, record_id, write_dataset

LOCAL = fsspec.filesystem("file")


def _lines(index: ShardIndex, records: bool = True, version: str = "") -> str:
    """A text manifest; `version` "plain" or "quoted" adds the versions (ETags)."""
    rows = ["# url size records version", ""]
    for s in index.shards:
        name = s.url.rsplit("/", 1)[1]  # relative: to the manifest's folder
        tag = {"": "", "plain": f" {s.version}", "quoted": f' "{s.version}"'}[version]
        rows.append(f"{name} {s.bytes} {s.num_records if records else '-'}{tag}")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_text_manifest_with_counts_reads_no_shard_to_start(tmp_path: Path, fmt: str) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), fmt)
    listed = ShardIndex.build(str(tmp_path / "d"))
    (tmp_path / "d" / "train.manifest").write_text(_lines(listed))
    index = ShardIndex.build(str(tmp_path / "d" / "train.manifest"))
    assert [s.url for s in index.shards] == [s.url for s in listed.shards]
    assert index.shard_sizes.tolist() == SIZES
    deferred = [bool(s.details.get("deferred")) for s in index.shards]
    # Parquet: the first shard's footer gives the dataset's schema (the shard stays
    # deferred: the index holds no layout for any shard); nothing else is read
    assert deferred == [True] * 6
    if fmt == "parquet":
        assert index.schema == listed.schema
    ds = StreamingDataset(str(tmp_path / "d" / "train.manifest"), seed=3)
    assert sorted(record_id(r) for r in ds) == list(range(sum(SIZES)))
    # a folder holding a manifest: the manifest is not a shard
    assert len(ShardIndex.build(str(tmp_path / "d"))) == len(SIZES)


def test_parquet_manifest_with_and_without_counts(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    listed = ShardIndex.build(str(tmp_path / "d"))
    table = pa.table(
        {
            "url": [s.url for s in listed.shards],  # absolute here
            "size": [s.bytes for s in listed.shards],
            "records": [s.num_records if i % 2 else None for i, s in enumerate(listed.shards)],
        }
    )
    pq.write_table(table, tmp_path / "train.manifest.parquet")
    index = ShardIndex.build(str(tmp_path / "train.manifest.parquet"))
    assert index.shard_sizes.tolist() == SIZES
    # shards without a count are indexed as a listing would index them
    for i, (got, want) in enumerate(zip(index.shards, listed.shards)):
        assert ("deferred" in got.details) == bool(i % 2)
        if not i % 2:
            assert got.details == want.details
    ids = sorted(record_id(r) for r in StreamingDataset(index, batch_size=None))
    assert ids == list(range(sum(SIZES)))


def test_a_manifest_over_s3_lists_nothing_and_reads_one_footer(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("man")
    write_dataset(fs, "man/d", "parquet")
    listed = ShardIndex.build("s3://man/d", s3.storage_options)
    fs.pipe("man/d/train.manifest", _lines(listed, version="quoted").encode())  # as S3 gives
    SCANS.clear()  # as in a fresh process (this one indexed the shards just now)
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        index = ShardIndex.build("s3://man/d/train.manifest", opts)
    assert index.shard_sizes.tolist() == SIZES
    assert [s.version for s in index.shards] == [s.version for s in listed.shards]
    gets = [path for method, path, _ in proxy.requests if method == "GET"]
    assert not [p for p in gets if "list-type" in p]  # no listing
    assert [p for p in gets if p.endswith(".parquet")] == ["/man/d/part-00000.parquet"]
    ids = sorted(record_id(r) for r in StreamingDataset(index, storage_options=s3.storage_options))
    assert ids == list(range(sum(SIZES)))


def test_a_wrong_count_or_version_is_caught_when_the_shard_is_read(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "tar")
    listed = ShardIndex.build(str(tmp_path / "d"))
    size = listed.shards[2].bytes
    text = _lines(listed).replace(f"part-00002.tar {size} 41", f"part-00002.tar {size} 40")
    (tmp_path / "d" / "a.manifest").write_text(text)
    index = ShardIndex.build(str(tmp_path / "d" / "a.manifest"))
    with pytest.raises(StaleSidecarError, match=r"a.manifest: gives 40 records for .*part-00002"):
        list(StreamingDataset(index, shuffle=False))
    bad = _lines(listed, version="plain").replace(str(listed.shards[0].version), "0:0")
    (tmp_path / "d" / "b.manifest").write_text(bad)
    index = ShardIndex.build(str(tmp_path / "d" / "b.manifest"))
    with pytest.raises(StaleIndexError, match=r"part-00000.tar \(indexed \d+ bytes, version 0:0"):
        list(StreamingDataset(index, shuffle=False))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a.parquet\n", r"x.manifest line 1: expected 'url size \[records \[version\]\]'"),
        ("a.parquet - 3\n", r"x.manifest line 1: the size of a.parquet is required"),
        ("# c\na.parquet 10 ten\n", r"x.manifest line 2: records must be an integer >= 0"),
        ("a.parquet -5\n", r"x.manifest line 1: size must be an integer >= 0"),
        ("# nothing\n", r"x.manifest: the manifest names no shards"),
        ("a.csv 10\n", r"a.csv: unknown shard format"),
    ],
)
def test_malformed_manifests_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "x.manifest").write_text(text)
    with pytest.raises(ValueError, match=message):
        ShardIndex.build(str(tmp_path / "x.manifest"))


def test_a_parquet_manifest_needs_url_and_size(tmp_path: Path) -> None:
    pq.write_table(pa.table({"url": ["a.parquet"]}), tmp_path / "m.manifest.parquet")
    with pytest.raises(ValueError, match=r"needs columns url and size \(missing \['size'\]"):
        ShardIndex.build(str(tmp_path / "m.manifest.parquet"))


_FRESH = """
import json, sys
from shardstream.loader import ShardIndex, StreamingDataset
from tests.datagen import record_id
ids = {m: sorted(record_id(r) for r in StreamingDataset(m, seed=2)) for m in sys.argv[1:]}
sizes = {m: ShardIndex.build(m).shard_sizes.tolist() for m in sys.argv[1:]}
print(sorted(m for m in ("pandas", "pyarrow.dataset") if m in sys.modules))
print(json.dumps([ids, sizes]))
"""


def test_manifests_start_without_pandas(tmp_path: Path) -> None:
    # pyarrow imports pandas (0.17 s, ~40 MB) from `pa.array`, `pa.scalar`, `fill_null`
    # and compute calls given Python values: a manifest's relative URLs, "-" counts and
    # quoted versions are read without them
    import json
    import subprocess
    import sys

    import pandas  # noqa: F401  (installed: the test extra has it, so the check means something)

    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    listed = ShardIndex.build(str(tmp_path / "d"))
    text = _lines(listed, records=False, version="quoted")
    (tmp_path / "d" / "a.manifest").write_text(text)
    table = pa.table(
        {
            "url": [s.url.rsplit("/", 1)[1] for s in listed.shards],
            "size": [s.bytes for s in listed.shards],
            "records": [s.num_records if i % 2 else None for i, s in enumerate(listed.shards)],
            "version": ["-" if i % 3 else s.version for i, s in enumerate(listed.shards)],
        }
    )
    pq.write_table(table, tmp_path / "d" / "b.manifest.parquet")
    sources = [str(tmp_path / "d" / n) for n in ("a.manifest", "b.manifest.parquet")]
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, *sources],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    modules, got = out.stdout.strip().splitlines()
    assert modules == "[]"
    want = list(range(sum(SIZES)))
    assert json.loads(got) == [{m: want for m in sources}, {m: SIZES for m in sources}]


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_relative_names_are_held_once_with_their_folder(tmp_path: Path, fmt: str) -> None:
    """A manifest's relative names stay names (its folder held once, loader.index.urls):
    the shards, a saved index and the records are those of the full URLs, and key=value
    folders in the names are partitions as when the manifest's folder is listed."""
    root = tmp_path / "ds"
    write_dataset(LOCAL, str(root / "year=2024"), fmt)
    listed = ShardIndex.build(str(root))
    names = [s.url.split("/ds/", 1)[1] for s in listed.shards]  # year=2024/part-...
    lines = [f"{n} {s.bytes} {s.num_records}" for n, s in zip(names, listed.shards)]
    (root / "train.manifest").write_text("\n".join(lines) + "\n")
    index = ShardIndex.build(str(root / "train.manifest"))
    assert index.table.column("url").to_pylist() == names
    assert [s.url for s in index.shards] == [s.url for s in listed.shards]
    for name in ("i.index.arrow", "i.index.json"):
        index.save(str(tmp_path / name))
        loaded = ShardIndex.load(str(tmp_path / name))
        assert loaded == index
        assert [s.url for s in loaded.shards] == [s.url for s in listed.shards]
    saved = ShardIndex.load(str(tmp_path / "i.index.arrow")).table.column("url").to_pylist()
    assert saved == [s.url for s in listed.shards]  # a saved index holds full URLs
    if fmt == "parquet":
        assert index.partitioning == listed.partitioning
        assert listed.partitioning is not None and listed.partitioning.names == ["year"]
        # folders above a manifest are not its partitions, as above a listed folder
        inner = root / "year=2024" / "inner.manifest"
        inner.write_text("\n".join(x.split("/", 1)[1] for x in lines) + "\n")
        assert ShardIndex.build(str(inner)).partitioning is None
        assert ShardIndex.build(str(root / "year=2024")).partitioning is None
    want = list(StreamingDataset(str(root), shuffle=False))
    for source in (str(root / "train.manifest"), index, str(tmp_path / "i.index.arrow")):
        got = list(StreamingDataset(source, shuffle=False))
        assert got == want  # whole records, every column (tar: __url__ full)
