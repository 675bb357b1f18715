"""ShardIndex: discovery, what it records, save/load, staleness, and clear errors."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardError, ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.formats.parquet.meta import TAIL
from tests.s3proxy import counting_proxy

from .datagen import SIZES, parquet_table, record_id, write_dataset

LOCAL = fsspec.filesystem("file")


def test_discovery_from_dir_glob_file_and_list(tmp_path: Path) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "parquet")
    (tmp_path / "_SUCCESS").write_text("")  # not a shard: ignored in a directory
    by_dir = ShardIndex.build(str(tmp_path))
    assert [s.url for s in by_dir.shards] == paths  # as the source names them
    assert by_dir.shard_sizes.tolist() == SIZES and by_dir.num_records == sum(SIZES)
    assert len(ShardIndex.build(str(tmp_path / "part-0000[0-2].parquet"))) == 3
    assert len(ShardIndex.build(paths[2])) == 1
    assert ShardIndex.build(paths[::-1]).shard_sizes.tolist() == SIZES[::-1]


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_pathlib_paths_are_sources_too(tmp_path: Path, fmt: str) -> None:
    paths = [Path(p) for p in write_dataset(LOCAL, str(tmp_path / "d"), fmt)]
    by_str = ShardIndex.build(str(tmp_path / "d"))
    for source in (tmp_path / "d", paths, tuple(paths), [str(paths[0]), *paths[1:]]):
        assert ShardIndex.build(source).to_json() == by_str.to_json(), source
        assert ShardIndex.resolve(source).to_json() == by_str.to_json(), source
    saved = tmp_path / "train.index.json"
    by_str.save(saved)  # a Path to save to, and to load or resolve from
    assert ShardIndex.load(saved).to_json() == by_str.to_json()
    assert ShardIndex.resolve(saved).to_json() == by_str.to_json()
    want = sorted(record_id(r) for r in StreamingDataset(str(tmp_path / "d"), seed=1))
    for source in (tmp_path / "d", paths, saved):
        assert sorted(record_id(r) for r in StreamingDataset(source, seed=1)) == want


def test_parquet_details_are_row_groups_with_byte_ranges(tmp_path: Path) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[20], row_group_size=8)
    shard = ShardIndex.build(paths).shards[0]
    d = shard.details
    assert d["row_group_rows"] == [8, 8, 4]
    meta = pq.read_metadata(paths[0])
    assert d["footer_bytes"] == meta.serialized_size + 8  # + length and magic
    raw = Path(paths[0]).read_bytes()
    assert shard.bytes == len(raw) and shard.version is not None
    # row groups lie one after the other between the leading magic and the footer
    ends = [off + n for off, n in zip(d["row_group_offsets"], d["row_group_bytes"])]
    assert d["row_group_offsets"][0] == 4
    assert d["row_group_offsets"][1:] == ends[:-1]
    assert ends[-1] == len(raw) - d["footer_bytes"]


def test_tar_details_are_member_ranges(tmp_path: Path) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "tar", sizes=[3])
    shard = ShardIndex.build(paths).shards[0]
    raw = Path(paths[0]).read_bytes()
    assert shard.details["keys"] == ["sample000000", "sample000001", "sample000002"]
    ext, off, size = shard.details["members"][1][1]
    assert ext == "txt" and raw[off : off + size] == b"record 1"


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_save_load_round_trip_as_json(tmp_path: Path, fmt: str) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), fmt)
    index = ShardIndex.build(str(tmp_path / "d"))
    index.save(str(tmp_path / "train.index.json"))
    doc = json.loads((tmp_path / "train.index.json").read_text())
    assert doc["format_version"] == 2 and len(doc["shards"]) == len(SIZES)
    loaded = ShardIndex.load(str(tmp_path / "train.index.json"))
    assert loaded.shards == index.shards
    assert (loaded.schema is None) == (fmt == "tar")
    if fmt == "parquet":
        assert loaded.schema.equals(index.schema)
    # a saved index is a source of its own
    ds = StreamingDataset(str(tmp_path / "train.index.json"), shuffle=False)
    assert len(list(ds)) == sum(SIZES)


def test_stale_index_is_detected_and_named(tmp_path: Path) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "parquet")
    index = ShardIndex.build(str(tmp_path))
    index.verify()  # fresh: no error
    sink = io.BytesIO()
    pq.write_table(parquet_table(0, 30), sink)
    Path(paths[3]).write_bytes(sink.getvalue())
    os.utime(paths[3], (1, 1))
    with pytest.raises(StaleIndexError, match=r"part-00003\.parquet \(indexed \d+ bytes"):
        index.verify()
    Path(paths[4]).unlink()
    with pytest.raises(StaleIndexError, match=r"2 shard\(s\) changed.*part-00004.parquet.*missing"):
        index.verify()


def test_mixed_formats_are_refused(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[3])
    write_dataset(LOCAL, str(tmp_path / "t"), "tar", sizes=[3])
    with pytest.raises(ValueError, match=r"mixed shard formats.*parquet.*tar"):
        ShardIndex.build(str(tmp_path))


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda p: str(p / "missing"), FileNotFoundError, "no such file, directory or prefix"),
        (lambda p: str(p), FileNotFoundError, r"no shards found \(0 files"),
        (lambda p: [str(p / "a.csv")], ValueError, r"a.csv: unknown shard format; known"),
        (lambda p: [], ValueError, "the source list is empty"),
        (lambda p: 42, ValueError, "source must be a URL"),
    ],
)
def test_bad_sources(tmp_path: Path, make: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ShardIndex.resolve(make(tmp_path))


def test_conflicting_schemas_name_the_shard(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[3, 3])
    pq.write_table(pa.table({"id": [1], "other": ["x"]}), tmp_path / "part-00002.parquet")
    index = ShardIndex.build(str(tmp_path))  # which columns matter is the reader's to say
    with pytest.raises(ShardError, match=r"part-00002.parquet: has no column 'value'"):
        StreamingDataset(index)
    with pytest.raises(ShardError, match=r"part-00000.parquet: has no column 'other'"):
        StreamingDataset(index, columns=["id", "other"])
    ids = sorted(r["id"] for r in StreamingDataset(index, columns=["id"]))
    assert ids == [0, 1, 1, 2, 3, 4, 5]


def test_not_parquet_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all, just bytes")
    with pytest.raises(ShardError, match=r"bad.parquet: not a Parquet file"):
        ShardIndex.build(str(tmp_path))


def test_s3_prefix_and_index_on_s3(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("data")
    write_dataset(fs, "data/set", "parquet")
    index = ShardIndex.build("s3://data/set/", s3.storage_options)
    assert index.shard_sizes.tolist() == SIZES
    assert all(s.url.startswith("s3://data/set/part-") for s in index.shards)
    index.save("s3://data/set.index.json", s3.storage_options)
    assert ShardIndex.load("s3://data/set.index.json", s3.storage_options).shards == index.shards
    index.verify(s3.storage_options)


def test_aws_endpoint_url_variable_is_enough(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = s3.fs()
    fs.mkdir("data")
    write_dataset(fs, "data/set", "tar")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    ds = StreamingDataset("s3://data/set", shuffle=False)  # no storage_options at all
    assert len(list(ds)) == sum(SIZES)


def test_wrong_bucket_is_named(s3: Any) -> None:
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket/x"):
        ShardIndex.build("s3://no-such-bucket/x", s3.storage_options)


def test_building_reads_only_parquet_footers(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("data")
    write_dataset(fs, "data/set", "parquet", sizes=[4000] * 4, row_group_size=500)
    total = sum(fs.size(p) for p in fs.ls("data/set"))
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        index = ShardIndex.build("s3://data/set", opts)
    assert all(s.details["footer_bytes"] <= TAIL for s in index.shards)
    tails = sum(min(TAIL, s.bytes) for s in index.shards)  # one read of each shard's end
    shard_bytes = sum(n for _, path, n in proxy.requests if "part-" in path)
    assert shard_bytes == tails  # from the shards themselves: their ends, nothing else
    assert proxy.bytes_served < total / 10  # the listing included


def test_footers_longer_than_the_tail_read(tmp_path: Path, monkeypatch: Any) -> None:
    from shardstream.loader.formats.parquet import format as parquet
    from shardstream.loader.formats.parquet import meta as parquet_meta

    write_dataset(LOCAL, str(tmp_path), "parquet")
    want = ShardIndex.build(str(tmp_path))
    monkeypatch.setattr(parquet, "TAIL", 64)  # every footer is longer: a second read each
    monkeypatch.setattr(parquet, "FOOTERS", parquet_meta.FooterCache(1 << 20))
    got = ShardIndex.build(str(tmp_path))
    assert [s.details for s in got.shards] == [s.details for s in want.shards]
    assert got.schema == want.schema
    assert sorted(record_id(r) for r in StreamingDataset(got)) == list(range(sum(SIZES)))


def test_footer_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    from shardstream.loader.formats.parquet.meta import FooterCache

    paths = write_dataset(LOCAL, str(tmp_path), "parquet")
    meta = pq.read_metadata(paths[0])
    cache = FooterCache(max_bytes=250)
    for i in range(5):
        cache.put((f"u{i}", None), meta, 100)
    assert len(cache) == 2 and cache.get(("u0", None)) is None  # the oldest went first
    assert cache.get(("u3", None)) is meta
    cache.put(("u5", None), meta, 100)  # u3 was used last: u4 goes
    assert cache.get(("u4", None)) is None and cache.get(("u3", None)) is meta
    cache.put(("big", None), meta, 1000)  # bigger than the bound: kept alone
    assert len(cache) == 1 and cache.get(("big", None)) is meta


@pytest.mark.parametrize("workers", [0, 2])
def test_reading_a_changed_shard_raises_stale_index(tmp_path: Path, workers: int) -> None:
    from torch.utils.data import DataLoader

    paths = write_dataset(LOCAL, str(tmp_path), "parquet")
    index = ShardIndex.build(str(tmp_path))
    sink = io.BytesIO()
    pq.write_table(parquet_table(0, 23), sink, compression="none")
    Path(paths[0]).write_bytes(sink.getvalue())
    loader = DataLoader(
        StreamingDataset(index, shuffle=False), batch_size=None, num_workers=workers
    )
    with pytest.raises(StaleIndexError, match=r"part-00000.parquet \(indexed .*rebuild it"):
        list(loader)


def test_s3_clients_keep_64_connections(s3: Any) -> None:
    from shardstream.loader.storage.filesystems import filesystem
    from shardstream.loader.storage.ranged_get import S3_CONCURRENCY

    # botocore's default pool of 10 made 64 concurrent footer reads wait for each other:
    # indexing N shards took N / 10 round trips (python -m scripts.bench.index --only latency)
    fs, _ = filesystem("s3://data/set", {**s3.storage_options, "skip_instance_cache": True})
    assert fs.config_kwargs["max_pool_connections"] == S3_CONCURRENCY == 64
    mine = {**s3.storage_options, "config_kwargs": {"max_pool_connections": 5}}
    fs, _ = filesystem("s3://data/set", {**mine, "skip_instance_cache": True})
    assert fs.config_kwargs["max_pool_connections"] == 5  # the caller's choice stays


def test_a_dataset_made_again_reads_no_footer_but_a_rewritten_shard_is_read(
    tmp_path: Path,
) -> None:
    """Indexing keeps what it found in each shard by the exact bytes it read (url, size,
    version): a dataset made again in the process reads no footer, and a shard written
    again (another size, or the same size at another time) is indexed afresh, never from
    what the old file held."""
    from shardstream.loader.storage.retry import bytes_fetched

    def write(name: str, ids: range, text: str) -> None:
        table = pa.table({"id": list(ids), "text": [f"{text}{i:04d}" for i in ids]})
        pq.write_table(table, tmp_path / name, row_group_size=4)

    def rows() -> list[dict[str, Any]]:
        return sorted(StreamingDataset(str(tmp_path), shuffle=False), key=lambda r: r["text"])

    write("a.parquet", range(10), "a")
    write("b.parquet", range(6), "b")
    first = rows()
    assert first == [{"id": i, "text": f"a{i:04d}"} for i in range(10)] + [
        {"id": i, "text": f"b{i:04d}"} for i in range(6)
    ]
    before = bytes_fetched()
    again = StreamingDataset(str(tmp_path), shuffle=False)
    assert bytes_fetched() == before  # indexed without reading a byte
    assert again.index.shard_sizes.tolist() == [10, 6]

    write("a.parquet", range(13), "c")  # another size
    stat = os.stat(tmp_path / "b.parquet")
    write("b.parquet", range(6), "d")  # the same size, written later
    os.utime(tmp_path / "b.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert os.stat(tmp_path / "b.parquet").st_size == stat.st_size
    assert rows() == [{"id": i, "text": f"c{i:04d}"} for i in range(13)] + [
        {"id": i, "text": f"d{i:04d}"} for i in range(6)
    ]
