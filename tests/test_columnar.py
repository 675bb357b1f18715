"""The columnar index: a listing and an index are arrays, Shards made only when asked for,
a saved index is an Arrow IPC file (JSON ones still load), a tar shard's member table is a
view of the index's columns until its shard is read, and a million-shard manifest job
touches only its own shards."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.loader.formats.tar.members import Members
from shardstream.loader.index.build import Hint, Listing, discover
from shardstream.loader.index.saved import TABLE_VERSION
from shardstream.loader.storage.filesystems import FileEntry

from .datagen import SIZES, parquet_table, record_id, write_dataset

LOCAL = fsspec.filesystem("file")


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_index_table_gives_back_the_shards_it_was_made_of(tmp_path: Path, fmt: str) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), fmt)
    built = ShardIndex.build(str(tmp_path / "d"))
    again = ShardIndex(list(built.shards), built.schemas, built.partitioning)
    assert again == built
    assert again.shard_sizes.tolist() == SIZES
    for a, b in zip(again.shards, built.shards):
        assert (a.url, a.num_records, a.bytes, a.version) == (
            b.url,
            b.num_records,
            b.bytes,
            b.version,
        )
        assert a.details == b.details
    if fmt == "tar":  # member tables are array views that read as the lists they replace
        members = built.shards[0].details["members"]
        assert isinstance(members, Members)
        # sample 0: its .cls member's data after one header, its .txt after the next
        assert members[0] == [["cls", 512, 1], ["txt", 1536, len("record 0")]]
        assert list(built.shards[0].details["keys"])[:2] == ["sample000000", "sample000001"]
    assert pickle.loads(pickle.dumps(built)) == built


def test_listing_columns_and_parts() -> None:
    entries = [FileEntry(f"s3://b/p/{i}.tar", 100 + i, f"v{i}", f"{i}.tar") for i in range(5)]
    side = FileEntry("s3://b/p/3.tar.idx", 7, None)
    hints = [None, Hint(4, "list", defer=True), None, Hint(None, "", sidecar=side), None]
    listing = Listing("tar", entries, hints)
    assert listing.entries == entries
    assert [listing.hint(i) for i in range(5)] == hints
    part = listing.part([3, 1])
    assert part.entries == [entries[3], entries[1]]
    assert [part.hint(0), part.hint(1)] == [hints[3], hints[1]]
    assert pickle.loads(pickle.dumps(listing)) == listing


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_saved_arrow_index_round_trips_and_json_still_loads(tmp_path: Path, fmt: str) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), fmt)
    built = ShardIndex.build(str(tmp_path / "d"))
    built.save(str(tmp_path / "d" / "train.index.arrow"))
    built.save(str(tmp_path / "train.index.json"))
    assert (tmp_path / "d" / "train.index.arrow").read_bytes()[:6] == b"ARROW1"
    loaded = ShardIndex.load(str(tmp_path / "d" / "train.index.arrow"))
    assert loaded == built
    assert ShardIndex.load(str(tmp_path / "train.index.json")) == built
    # a saved index beside the shards is not one of them
    assert ShardIndex.build(str(tmp_path / "d")) == built
    want = sorted(record_id(r) for r in StreamingDataset(str(tmp_path / "d")))
    got = sorted(record_id(r) for r in StreamingDataset(str(tmp_path / "d" / "train.index.arrow")))
    assert got == want == list(range(sum(SIZES)))


def test_saved_arrow_index_refuses_other_files_and_versions(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    index = ShardIndex.build(str(tmp_path / "d"))
    path = tmp_path / "i.index.arrow"
    index.save(str(path))
    table = pa.ipc.open_file(str(path)).read_all()
    meta = json.loads(table.schema.metadata[b"shardstream"])
    meta["format_version"] = TABLE_VERSION + 1
    old = table.replace_schema_metadata({b"shardstream": json.dumps(meta).encode()})
    with pa.ipc.new_file(str(path), old.schema) as w:
        w.write_table(old)
    with pytest.raises(
        ValueError, match=rf"i.index.arrow: index format version {TABLE_VERSION + 1}"
    ):
        ShardIndex.load(str(path))
    other = tmp_path / "other.index.arrow"
    with pa.ipc.new_file(str(other), pa.schema([("a", pa.int64())])) as w:
        w.write_table(pa.table({"a": [1]}))
    with pytest.raises(ValueError, match=r"other\.index\.arrow: an Arrow file, but not"):
        ShardIndex.load(str(other))


def test_saved_index_keeps_no_credentials_and_saves_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    monkeypatch.chdir(tmp_path)
    index = ShardIndex.build("d")
    assert not index.shards[0].url.startswith("/")
    for name in ("rel.index.arrow", "rel.index.json"):
        index.save(name)
        assert ShardIndex.load(name).shards[0].url == str(tmp_path / "d" / "part-00000.parquet")
    table = index.table.set_column(
        0, "url", pa.array(["https://user:pa55@host/x.parquet"] * len(index), pa.string())
    )
    secret = ShardIndex(schemas=index.schemas, table=table, format="parquet")
    secret.save("s.index.arrow")
    assert b"pa55" not in Path("s.index.arrow").read_bytes()
    assert ShardIndex.load("s.index.arrow").shards[0].url == "https://host/x.parquet"


def test_tar_member_tables_stay_columns_until_read(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path / "t"), "tar")
    ShardIndex.build(str(tmp_path / "t")).save(str(tmp_path / "t.index.arrow"))
    index = ShardIndex.load(str(tmp_path / "t.index.arrow"))
    ds = StreamingDataset(index, shuffle=False)
    assert not index.shards._views  # constructing made no Shard
    first = next(iter(ds))
    assert first["__key__"] == "sample000000"
    # shards are made as the reader opens them (it reads ahead): never the empty one
    assert set(index.shards._views) <= {0, 2, 3, 4, 5}
    members = index.shards[2].details["members"]
    assert members.span(0, 2) == (members[0][0][1], members[1][-1][1] + members[1][-1][2])
    assert members.record_bytes().tolist()[:2] == [sum(m[2] for m in members[k]) for k in (0, 1)]
    assert members.data_bytes(0, 3, ["txt"]) == sum(members[k][1][2] for k in range(3))
    assert Members.of_lists(list(members)) == members


def test_a_large_manifest_touches_only_the_ranks_shards(tmp_path: Path) -> None:
    """200,000 shards named by a Parquet manifest with counts, rank 3 of 2,048: only that
    rank's ~98 shards exist on disk; it reads exactly its records, and the index made a
    Shard object only for shards a reader opened."""
    n, per, world, rank = 200_000, 4, 2_048, 3
    (tmp_path / "d").mkdir()
    table = parquet_table(0, per)
    mine = range(rank * n // world - 1, (rank + 1) * n // world + 2)  # its own, and a margin
    for k in [0, *mine]:
        pq.write_table(parquet_table(k * per, per), tmp_path / "d" / f"s{k:07d}.parquet")
    sizes = np.full(n, (tmp_path / "d" / "s0000000.parquet").stat().st_size)
    for k in mine:
        sizes[k] = (tmp_path / "d" / f"s{k:07d}.parquet").stat().st_size
    manifest = tmp_path / "d" / "train.manifest.parquet"
    names = pa.array([f"s{k:07d}.parquet" for k in range(n)])
    pq.write_table(pa.table({"url": names, "size": sizes, "records": np.full(n, per)}), manifest)
    ds = StreamingDataset(
        str(manifest), num_replicas=world, rank=rank, shuffle=False, batch_size=64
    )
    assert ds.index.num_records == n * per and len(ds.index) == n
    assert ds.index.schema == table.schema.remove_metadata()
    ids = np.concatenate([b["id"].numpy() for b in ds])
    length = -(-n * per // world)  # records a rank reads, as DistributedSampler counts
    assert ids.tolist() == list(range(rank * length, (rank + 1) * length))
    assert len(ds.index.shards._views) < 200


def test_listing_a_manifest_is_columns(tmp_path: Path) -> None:
    (tmp_path / "m.manifest").write_text('a.parquet 10 3\n/elsewhere/b.parquet 20 - "e1"\n')
    listing = discover(str(tmp_path / "m.manifest"))
    # the names as written, the manifest's folder once (loader.index.urls)
    assert listing.urls.to_pylist() == ["a.parquet", "/elsewhere/b.parquet"]
    assert listing.base == str(tmp_path)
    full = [str(tmp_path / "a.parquet"), "/elsewhere/b.parquet"]
    assert [listing.url(i) for i in range(2)] == [e.url for e in listing.entries] == full
    assert [listing.part([1, 0]).url(i) for i in range(2)] == full[::-1]
    assert Listing.from_buffer(listing.to_buffer()) == listing
    assert listing.sizes.tolist() == [10, 20]
    assert listing.records.tolist() == [3, -1]
    assert listing.defer.tolist() == [True, False]
    assert listing.versions.to_pylist() == [None, "e1"]


def test_tar_read_groups_close_where_the_record_by_record_rule_closes() -> None:
    """Members.groups (one search a group) against the rule it implements: a group closes
    at the first record that brings its member data to the limit."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        records = [
            [["x", 0, int(size)] for size in rng.integers(0, 400, int(rng.integers(1, 4)))]
            for _ in range(int(rng.integers(1, 60)))
        ]
        limit = int(rng.integers(1, 900))
        want, rows, held = [], 0, 0
        for record in records:
            rows, held = rows + 1, held + sum(m[2] for m in record)
            if held >= limit:
                want.append(rows)
                rows = held = 0
        want += [rows] if rows else []
        assert Members.of_lists(records).groups(limit) == want
