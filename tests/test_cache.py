"""The node cache (loader.cache.node), against a real S3 endpoint (moto) behind the counting
proxy: bytes fetched per node and epoch, records identical with and without the cache,
damaged files, a process killed mid-write, a rewritten shard, local sources untouched."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from shardstream.loader import ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.cache import node as cache_node
from shardstream.loader.cache.holdings import COUNT
from shardstream.loader.cache.node import NodeCache, parse_size
from tests.s3proxy import counting_proxy

from .conftest import REPO
from .datagen import record_id, write_dataset

SIZES = [300, 0, 410, 170, 350, 90, 200, 260]
BLOCK_FILE = re.compile(r"^[0-9a-f]{32}-\d+-\d+\.blk$")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Blocks of 16 KiB, so the test shards (~100 KB to 1 MB) are several blocks each."""
    monkeypatch.setattr(cache_node, "BLOCK", 16384)
    return 16384


def upload(s3: Any, fmt: str = "parquet") -> str:
    fs = s3.fs()
    fs.mkdir("cached")
    write_dataset(fs, f"cached/{fmt}", fmt, sizes=SIZES, row_group_size=40, payload=600)
    return f"s3://cached/{fmt}"


def node_epoch(
    url: str, options: dict, cache: Path | None, epoch: int, ranks=(0, 1), **kw: Any
) -> list[list[int]]:
    """Records each of `ranks` (of 4, nodes of 2) reads in `epoch`, the ranks at once (one
    thread each), all with `cache` as their node's folder."""
    out: list[list[int]] = [[] for _ in ranks]
    errors: list[BaseException] = []

    def one(k: int, rank: int) -> None:
        try:
            ds = StreamingDataset(
                url,
                num_replicas=4,
                rank=rank,
                seed=3,
                storage_options=options,
                cache_dir=cache,
                locality="node",
                local_world_size=2,
                **kw,
            )
            ds.set_epoch(epoch)
            out[k] = [record_id(r) for r in ds]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(k, r)) for k, r in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_later_epochs_come_from_the_cache_with_the_same_records(
    s3: Any, tmp_path: Path, fmt: str, small_blocks: int
) -> None:
    url = upload(s3, fmt)
    with counting_proxy(s3.endpoint_url) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        url = ShardIndex.build(url, storage_options=options)  # indexed once: data reads only
        fetched = []
        for epoch in range(3):
            plain = node_epoch(url, options, None, epoch)
            before = proxy.object_bytes
            assert node_epoch(url, options, tmp_path / "node0", epoch) == plain
            fetched.append(proxy.object_bytes - before)
        ds = StreamingDataset(
            url,
            num_replicas=4,
            rank=0,
            seed=3,
            storage_options=options,
            cache_dir=tmp_path / "node0",
            locality="node",
            local_world_size=2,
        )
        ds.set_epoch(3)
        before = proxy.object_bytes
        assert len(list(ds)) == len(ds)
        assert proxy.object_bytes == before  # epoch 3 of rank 0: nothing from S3
        stats = ds.stats()
    assert fetched[0] > 0 and fetched[1] == fetched[2] == 0, fetched
    assert stats["bytes_fetched"] == 0 and stats["cache_hit_bytes"] > 0
    held = sum(p.stat().st_size for p in (tmp_path / "node0").iterdir())
    assert stats["cache_held_bytes"] == held > 0
    assert all(BLOCK_FILE.match(p.name) for p in (tmp_path / "node0").iterdir())


def test_a_node_fetches_each_range_once(s3: Any, tmp_path: Path, small_blocks: int) -> None:
    """Two ranks of a node read at once: no byte of a shard is fetched twice (a block one
    rank is fetching, the other waits for), and what both fetched is the node's share."""
    url = upload(s3)
    with counting_proxy(s3.endpoint_url) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        url = ShardIndex.build(url, storage_options=options)
        proxy.gets.clear()
        node_epoch(url, options, tmp_path / "n", 0)
        got: dict[str, list[tuple[int, int]]] = {}
        for path, asked in proxy.gets:
            found = re.fullmatch(r"bytes=(\d+)-(\d+)", asked or "")
            assert found, (path, asked)
            got.setdefault(path, []).append((int(found[1]), int(found[2]) + 1))
    assert got
    for path, ranges in got.items():
        ranges.sort()
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end <= start, f"{path}: bytes fetched twice: {ranges}"


def test_a_damaged_block_is_fetched_again_and_never_decoded(
    s3: Any, tmp_path: Path, small_blocks: int, caplog: pytest.LogCaptureFixture
) -> None:
    url = upload(s3)
    with counting_proxy(s3.endpoint_url) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        url = ShardIndex.build(url, storage_options=options)
        want = node_epoch(url, options, tmp_path / "n", 1)
        blocks = sorted((tmp_path / "n").iterdir())
        flipped, cut = blocks[0], blocks[1]
        data = bytearray(flipped.read_bytes())
        data[100] ^= 0xFF
        flipped.write_bytes(bytes(data))
        cut.write_bytes(cut.read_bytes()[:-7])
        before = proxy.object_bytes
        with caplog.at_level(logging.WARNING, logger="shardstream.loader.cache.node"):
            assert node_epoch(url, options, tmp_path / "n", 1) == want
        refetched = proxy.object_bytes - before
    damaged = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert any(flipped.name in m and "checksum" in m for m in damaged), damaged
    assert any(cut.name in m and "bytes, expected" in m for m in damaged), damaged
    assert 0 < refetched <= 2 * small_blocks


KILLER = """
import os, sys
sys.path.insert(0, {repo!r})
from shardstream.loader import StreamingDataset
real = os.replace
def dies(src, dst):  # the process is killed after writing a block, before renaming it
    open(src, "ab").close()
    os._exit(9)
os.replace = dies
ds = StreamingDataset({url!r}, storage_options={options!r}, cache_dir={cache!r}, seed=3)
for _ in ds:
    pass
"""


def test_a_process_killed_mid_write_leaves_no_block(s3: Any, tmp_path: Path) -> None:
    url = upload(s3)
    cache = tmp_path / "n"
    options = s3.storage_options
    script = KILLER.format(repo=str(REPO), url=url, options=options, cache=str(cache))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert run.returncode == 9, run.stderr.decode()[-2000:]
    left = [p.name for p in cache.iterdir()]
    assert left and not any(BLOCK_FILE.match(n) for n in left), left  # temporary files only
    ds = StreamingDataset(url, storage_options=options, cache_dir=cache, seed=3)
    plain = StreamingDataset(url, storage_options=options, seed=3)
    assert [record_id(r) for r in ds] == [record_id(r) for r in plain]
    assert any(BLOCK_FILE.match(p.name) for p in cache.iterdir())


def test_a_rewritten_shard_is_stale_not_served_from_the_cache(s3: Any, tmp_path: Path) -> None:
    url = upload(s3)
    options = s3.storage_options
    ds = StreamingDataset(url, storage_options=options, cache_dir=tmp_path / "n", seed=3)
    list(ds)
    fs = s3.fs()
    path = "cached/parquet/part-00002.parquet"
    data = bytearray(fs.cat(path))
    data[len(data) // 2] ^= 0xFF  # same size, another ETag
    fs.pipe(path, bytes(data))
    ds.set_epoch(1)
    with pytest.raises(StaleIndexError, match=r"part-00002\.parquet"):
        list(ds)


def test_local_sources_are_never_copied(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write_dataset(LocalFileSystem(), str(root), "parquet", sizes=SIZES, row_group_size=40)
    stamps = {p: p.stat().st_mtime_ns for p in root.iterdir()}
    ds = StreamingDataset(str(root), cache_dir=tmp_path / "c", cache_limit="1MB")
    assert len(list(ds)) == sum(SIZES)
    assert not (tmp_path / "c").exists() or list((tmp_path / "c").iterdir()) == []
    assert ds.stats()["cache_hit_bytes"] == 0 and ds.stats()["cache_held_bytes"] == 0
    assert {p: p.stat().st_mtime_ns for p in root.iterdir()} == stamps


class Future:
    """A known future for NodeCache: shard k of key `k * 32` is next used at `uses[k]`."""

    def __init__(self, uses: dict[int, float]) -> None:
        self.uses = uses

    def shard_of(self, key: str) -> int | None:
        return int(key[0], 16) if key == key[0] * 32 else None

    def next_use(self, shards, after=False):
        return [self.uses[s] for s in shards]

    def reached(self, shard: int) -> None:
        pass


def put(cache: NodeCache, shard: int, size: int = 1000) -> str:
    name = f"{str(shard) * 32}-0-{size}.blk"
    cache._put(name, bytes([shard]) * size)
    return name


def test_eviction_drops_the_block_needed_furthest_ahead(tmp_path: Path) -> None:
    """Belady: with room for two blocks, a third evicts the one used last; a block used
    after everything held is not kept; the cache never deletes a file it did not name."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "x.blk").write_text("not the cache's")
    future = Future({1: 5.0, 2: 1.0, 3: 3.0, 4: 9.0})
    cache = NodeCache(tmp_path, limit=2 * (1000 + 4 + 16), future=future)
    a, b = put(cache, 1), put(cache, 2)
    c = put(cache, 3)
    names = {p.name for p in tmp_path.iterdir()} - {COUNT}
    assert {b, c} <= names and a not in names  # 1 (used at 5) went for 3 (used at 3)
    d = put(cache, 4)
    names = {p.name for p in tmp_path.iterdir()} - {COUNT}
    assert d not in names and {b, c} <= names  # 4 is used after everything held
    assert {"notes.txt", "x.blk"} <= names
    assert cache._get(b, 10, 20) == bytes([2]) * 10


def test_lru_for_comparison_drops_the_least_recently_read(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, limit=2 * (1000 + 4 + 16), policy="lru")
    a, b = put(cache, 1), put(cache, 2)
    os.utime(tmp_path / a, (1, 1))  # read long ago
    c = put(cache, 3)
    names = {p.name for p in tmp_path.iterdir()} - {COUNT}
    assert names == {b, c}


def test_uneven_writers_of_one_folder_never_pass_the_limit(tmp_path: Path) -> None:
    """Two processes' caches on one folder (two objects here, each with its own view):
    one writes many blocks while the other, whose listing is fresh, writes one. Their
    shared count makes the second evict instead of trusting its stale view; a block
    deleted by hand only makes the count high, and the next tight write corrects it."""
    block = 1000 + 4 + 16  # a block file of 1,000 bytes (data, trailer, CRC)
    limit = 3 * block
    future = Future({k: float(k) for k in range(1, 10)})
    fast = NodeCache(tmp_path, limit=limit, future=future, sharers=2)
    slow = NodeCache(tmp_path, limit=limit, future=future, sharers=2)
    slow.held(rescan=True)  # its view: an empty folder, trusted for RESCAN seconds

    def blocks() -> set[str]:
        return {p.name for p in tmp_path.iterdir()} - {COUNT}

    for k in (1, 2, 3, 4):
        put(fast, k)
    put(slow, 5)
    assert sum((tmp_path / n).stat().st_size for n in blocks()) <= limit
    assert len(blocks()) == 3
    counted = int((tmp_path / COUNT).read_text())
    assert counted == sum((tmp_path / n).stat().st_size for n in blocks())
    (tmp_path / sorted(blocks())[0]).unlink()  # gone behind the caches' backs
    put(fast, 6)
    put(slow, 7)
    on_disk = sum((tmp_path / n).stat().st_size for n in blocks())
    assert on_disk <= limit and int((tmp_path / COUNT).read_text()) >= on_disk


def test_next_use_beats_lru_at_half_the_share(s3: Any, tmp_path: Path, small_blocks: int) -> None:
    """One rank, 3 epochs, a cache of half what it reads: by next use, epochs 1 and 2 fetch
    at most 0.6 of the share; LRU (epoch-shaped access) fetches more."""
    url = upload(s3)
    with counting_proxy(s3.endpoint_url) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        url = ShardIndex.build(url, storage_options=options)
        whole = StreamingDataset(url, storage_options=options, seed=3, cache_dir=tmp_path / "all")
        list(whole)
        share = whole.stats()["cache_held_bytes"]
        fetched = {}
        for policy in ("next-use", "lru"):
            ds = StreamingDataset(
                url,
                storage_options=options,
                seed=3,
                cache_dir=tmp_path / policy,
                cache_limit=share // 2,
            )
            ds.node = dataclasses.replace(ds.node, policy=policy)
            fetched[policy] = []
            for epoch in range(3):
                ds.set_epoch(epoch)
                before = proxy.object_bytes
                list(ds)
                fetched[policy].append(proxy.object_bytes - before)
            assert ds.stats()["cache_held_bytes"] <= share // 2
    best, lru = fetched["next-use"], fetched["lru"]
    assert best[1] <= 0.6 * share and best[2] <= 0.6 * share, (share, best)
    assert lru[1] + lru[2] > best[1] + best[2], (lru, best)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("50GB", 50 * 10**9), ("512MiB", 512 * 2**20), (1234, 1234), ("1.5 KB", 1500)],
)
def test_cache_limits_read_as_bytes(value: Any, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [0, -1, "lots", "5 parsecs", True, 1.5])
def test_bad_cache_limits_are_named(value: Any) -> None:
    with pytest.raises(ValueError, match="cache_limit must be bytes"):
        parse_size(value)


def test_a_mixture_stream_has_its_own_cache(s3: Any, tmp_path: Path) -> None:
    """Stream(cache_dir=...): the stream's bytes come from its folder in the next epoch;
    a stream without one (and no dataset-wide cache_dir) is read from S3 every epoch."""
    from shardstream.loader import Stream

    fs = s3.fs()
    fs.mkdir("mix")
    write_dataset(fs, "mix/a", "parquet", sizes=[50, 40], row_group_size=10)
    write_dataset(fs, "mix/b", "parquet", sizes=[30, 60], row_group_size=10)
    with counting_proxy(s3.endpoint_url) as proxy:
        options = {"client_kwargs": {"endpoint_url": proxy.url}}
        a = ShardIndex.build("s3://mix/a", storage_options=options)
        b = ShardIndex.build("s3://mix/b", storage_options=options)
        ds = StreamingDataset(
            [Stream(a, cache_dir=tmp_path / "a"), Stream(b)], storage_options=options, seed=2
        )
        fetched = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            proxy.gets.clear()
            assert len(list(ds)) == 180
            fetched.append({p.split("/")[2] for p, _ in proxy.gets})
    assert fetched[0] == {"a", "b"} and fetched[1] == {"b"}
    assert all(BLOCK_FILE.match(p.name) for p in (tmp_path / "a").iterdir())


def test_a_nodes_ranks_together_stay_within_the_limit(
    s3: Any, tmp_path: Path, small_blocks: int
) -> None:
    """Two ranks (two cache objects, as two processes) write one folder at once: what it
    holds never passes cache_limit (each assumes the other wrote as much as it did)."""
    url = upload(s3)
    index = ShardIndex.build(url, storage_options=s3.storage_options)
    limit = 200_000
    for epoch in range(3):
        node_epoch(index, s3.storage_options, tmp_path / "n", epoch, cache_limit=limit)
        held = sum(p.stat().st_size for p in (tmp_path / "n").glob("*.blk"))
        assert 0.5 * limit < held <= limit, (epoch, held)
