"""A shard the node cache holds whole is read as one memory map over its block files
(loader.cache.mapped): the map is the shard's bytes, outlives its files, and is made only
of checked blocks; epochs read through it give every column of every record as an uncached
read and pyarrow.dataset do, against a real S3 endpoint (moto)."""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.loader.cache import node as cache_node
from shardstream.loader.cache.files import check_open, write_block
from shardstream.loader.cache.mapped import map_blocks
from shardstream.loader.cache.node import NodeCache
from shardstream.loader.formats.parquet.local import OpenFiles
from shardstream.loader.storage.through import reading_shard

from .datagen import write_dataset

BLOCK = 16384  # blocks of 16 KiB: the test shards (~100-400 KB) are several blocks each
SIZES = [300, 0, 410, 170, 350, 90]


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_node, "BLOCK", BLOCK)


@pytest.fixture
def maps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(url, whether a map was made) of each shard a reading thread opened from the cache."""
    seen: list[tuple[str, bool]] = []
    real = cache_node.NodeCache.mapped

    def recorded(self: Any, url: str, indexed: Any, end: int) -> Any:
        got = real(self, url, indexed, end)
        seen.append((url, got is not None))
        return got

    monkeypatch.setattr(cache_node.NodeCache, "mapped", recorded)
    return seen


def test_block_files_map_as_the_shard_bytes_and_outlive_their_files(tmp_path: Path) -> None:
    data = os.urandom(2 * BLOCK + 5000)
    paths, fds, sizes = [], [], []
    for lo in range(0, len(data), BLOCK):
        hi = min(lo + BLOCK, len(data))
        paths.append(tmp_path / f"{'0' * 32}-{lo}-{hi}.blk")
        write_block(paths[-1], data[lo:hi])
        fds.append(os.open(paths[-1], os.O_RDONLY))
        sizes.append(hi - lo)
        assert check_open(fds[-1], str(paths[-1]), hi - lo) is None
    buf = map_blocks(fds, sizes, BLOCK)
    for fd in fds:
        os.close(fd)
    assert buf is not None and buf.size == len(data)
    assert buf.to_pybytes() == data  # the data parts only: no CRCs, no trailers
    part = buf.slice(BLOCK - 100, 300)  # across the first two blocks
    del buf
    for p in paths:
        p.unlink()  # evicted: an unlinked file lives while it is mapped
    assert part.to_pybytes() == data[BLOCK - 100 : BLOCK + 200]
    assert pa.BufferReader(part).read_at(10, 290) == data[BLOCK + 190 : BLOCK + 200]


def test_a_damaged_block_file_is_found_before_it_is_mapped(tmp_path: Path) -> None:
    data = os.urandom(BLOCK)
    path = tmp_path / f"{'0' * 32}-0-{BLOCK}.blk"
    write_block(path, data)
    with open(path, "r+b") as f:
        f.seek(BLOCK // 2)
        f.write(bytes([data[BLOCK // 2] ^ 1]))  # one bit, in place: the same size
    fd = os.open(path, os.O_RDONLY)
    try:
        assert "checksum" in (check_open(fd, str(path), BLOCK) or "")
    finally:
        os.close(fd)


def upload(s3: Any) -> str:
    fs = s3.fs()
    fs.mkdir("mapped")
    write_dataset(fs, "mapped/p", "parquet", sizes=SIZES, row_group_size=40, payload=600)
    return ShardIndex.build("s3://mapped/p", storage_options=s3.storage_options)


def epoch(s3: Any, url: str, cache: Path | None, n: int, **kw: Any) -> tuple[list[Any], Any]:
    ds = StreamingDataset(url, storage_options=s3.storage_options, cache_dir=cache, seed=3, **kw)
    ds.set_epoch(n)
    return list(ds), ds


def rows(s3: Any) -> dict[Any, dict[str, Any]]:
    """Each record's row as pyarrow.dataset reads it, every column, by id."""
    table = pads.dataset("mapped/p", format="parquet", filesystem=s3.fs()).to_table()
    return {r["id"]: r for r in table.to_pylist()}


def test_a_cached_epoch_reads_each_shard_through_one_map(
    s3: Any, tmp_path: Path, small_blocks: None, maps: list[tuple[str, bool]]
) -> None:
    url = upload(s3)
    epoch(s3, url, tmp_path / "n", 0)  # fills the cache
    maps.clear()
    got, ds = epoch(s3, url, tmp_path / "n", 1)
    shards = {f"s3://mapped/p/part-{k:05d}.parquet" for k, n in enumerate(SIZES) if n}
    assert {u for u, made in maps if made} == shards and all(made for _, made in maps)
    assert got == epoch(s3, url, None, 1)[0]  # every record, in the same order
    by_id = rows(s3)
    assert len(got) == sum(SIZES) and all(r == by_id[r["id"]] for r in got)
    stats = ds.stats()
    assert stats["bytes_fetched"] == 0 and stats["cache_hit_bytes"] > 0


def test_a_damaged_block_is_fetched_again_not_mapped(
    s3: Any, tmp_path: Path, small_blocks: None, caplog: pytest.LogCaptureFixture
) -> None:
    url = upload(s3)
    epoch(s3, url, tmp_path / "n", 0)
    block = max((tmp_path / "n").glob("*.blk"), key=lambda p: p.stat().st_size)
    with open(block, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="shardstream.loader.cache.node"):
        got, ds = epoch(s3, url, tmp_path / "n", 1)
    assert any("is damaged" in r.getMessage() for r in caplog.records)
    by_id = rows(s3)
    assert len(got) == sum(SIZES) and all(r == by_id[r["id"]] for r in got)
    assert ds.stats()["bytes_fetched"] >= BLOCK // 2  # the damaged block, fetched again


def second_epoch_begun(s3: Any, cache: Path) -> tuple[Iterator[Any], list[Any]]:
    """Epoch 0 read (the cache filled), then epoch 1 begun: its iterator, its first record."""
    url = upload(s3)
    epoch(s3, url, cache, 0)
    ds = StreamingDataset(url, storage_options=s3.storage_options, cache_dir=cache, seed=3)
    ds.set_epoch(1)
    it = iter(ds)
    return it, [next(it)]


def test_blocks_evicted_while_an_epoch_reads_leave_every_record_whole(
    s3: Any, tmp_path: Path, small_blocks: None, maps: list[tuple[str, bool]]
) -> None:
    it, got = second_epoch_begun(s3, tmp_path / "n")
    for p in (tmp_path / "n").glob("*.blk"):
        p.unlink()  # every block, as another process's eviction could
    got += list(it)
    assert any(made for _, made in maps)  # some shards were read from their maps
    by_id = rows(s3)
    assert len(got) == sum(SIZES) and all(r == by_id[r["id"]] for r in got)


def mapped_blocks(folder: Path) -> set[str]:
    """The cache's block files this process has mapped now (Linux: /proc/self/maps)."""
    text = Path("/proc/self/maps").read_text()
    return {line.split()[-1] for line in text.splitlines() if str(folder) in line}


def test_an_epoch_leaves_no_block_mapped_when_it_ends(
    s3: Any, tmp_path: Path, small_blocks: None
) -> None:
    """A map would keep a block the cache evicts after the epoch on disk: maps last as long
    as the reading of their shards."""
    it, got = second_epoch_begun(s3, tmp_path / "n")
    assert mapped_blocks(tmp_path / "n")  # read through maps of the block files
    got += list(it)
    del it
    gc.collect()
    assert mapped_blocks(tmp_path / "n") == set()
    assert len(got) == sum(SIZES)


def test_every_thread_lets_go_of_its_maps_when_a_reading_ends(tmp_path: Path) -> None:
    """The consumer reads groups too (those the reading thread has not started), and it
    lives on after the reading: what it mapped goes when the reading ends, as the reading
    thread's does."""
    path = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"id": range(5000), "x": [b"y" * 50] * 5000}), path, row_group_size=500)
    shard = ShardIndex.build(str(path)).shards[0]
    meta, size = pq.read_metadata(path), path.stat().st_size
    indexed = [(size, shard.version)]
    cache = NodeCache(tmp_path / "cache")
    cache.block = BLOCK  # (an instance's block size: the module's is read at construction)
    whole = path.read_bytes()
    cache.read(None, [shard.url], [0], [size], indexed, lambda u, a, b, i: [whole[a[0] : b[0]]])
    files = OpenFiles()

    def fetch(a: int, b: int) -> bytes:
        raise AssertionError("read through the map, not the cache's files")

    def open_here(out: list[bool]) -> None:
        with reading_shard(cache, 0):
            pf, mapped = files.get(None, shard, meta, fetch)
            assert pf.read_row_groups([3]).column("id").to_pylist() == list(range(1500, 2000))
        out.append(mapped)

    made: list[bool] = []
    open_here(made)  # this thread (a consumer's)
    release, opened = threading.Event(), threading.Event()

    def reader() -> None:
        open_here(made)
        opened.set()
        release.wait(30)

    other = threading.Thread(target=reader)
    other.start()  # a reading thread, still alive
    try:
        assert opened.wait(30) and made == [True, True]
        assert mapped_blocks(tmp_path / "cache")
        files.drop_cached()
        gc.collect()
        assert mapped_blocks(tmp_path / "cache") == set()
    finally:
        release.set()
        other.join()


def test_a_shard_the_cache_holds_in_part_is_read_through_its_block_files(
    s3: Any, tmp_path: Path, small_blocks: None, maps: list[tuple[str, bool]]
) -> None:
    """Epochs of `id` only never fetch the blocks holding nothing but payload: no map of
    those shards (a hole would be bytes never fetched), their reads go through the block
    files."""
    url = upload(s3)
    epoch(s3, url, tmp_path / "n", 0, columns=["id"])
    maps.clear()
    got, ds = epoch(s3, url, tmp_path / "n", 1, columns=["id"])
    assert maps and not all(made for _, made in maps)
    assert got == epoch(s3, url, None, 1, columns=["id"])[0]
    assert sorted(r["id"] for r in got) == sorted(rows(s3))
    assert ds.stats()["bytes_fetched"] == 0
