"""Epochs the node cache serves, read as local files are (loader.read.readahead over the cache),
against a real S3 endpoint (moto): every column of every record as an uncached read and
pyarrow.dataset give them, nothing fetched, and a reading the cache only partly holds taking
the remote path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
import torch

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.loader.cache import node as cache_node
from shardstream.loader.formats.parquet import format as formats_parquet
from shardstream.loader.formats.parquet.meta import FooterCache
from tests.s3proxy import counting_proxy

from .datagen import write_dataset

SIZES = [300, 0, 410, 170, 350, 90]
READING_THREAD = "shardstream-read"


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Blocks of 16 KiB, so the test shards (~100-400 KB) are several blocks each."""

    monkeypatch.setattr(cache_node, "BLOCK", 16384)
    return 16384


def upload(s3: Any) -> str:
    fs = s3.fs()
    fs.mkdir("cachedread")
    write_dataset(fs, "cachedread/p", "parquet", sizes=SIZES, row_group_size=40, payload=600)
    return "s3://cachedread/p"


def dataset(url: str, options: dict[str, Any], cache: Path | None, epoch: int, **kw: Any) -> Any:
    ds = StreamingDataset(url, storage_options=options, cache_dir=cache, seed=3, **kw)
    ds.set_epoch(epoch)
    return ds


def read(ds: Any) -> tuple[list[Any], set[str]]:
    """What `ds` yields, and the names of the threads alive after its first item."""
    it = iter(ds)
    first = next(it)
    names = {t.name for t in threading.enumerate()}
    return [first, *it], names


def test_a_cached_epoch_is_read_on_the_reading_thread_record_for_record(
    s3: Any, tmp_path: Path, small_blocks: int
) -> None:
    options = s3.storage_options
    url = ShardIndex.build(upload(s3), storage_options=options)
    list(dataset(url, options, tmp_path / "n", 0))  # epoch 0 fills the cache
    ds = dataset(url, options, tmp_path / "n", 1)
    got, threads = read(ds)
    plain, plain_threads = read(dataset(url, options, None, 1))
    assert any(n.startswith(READING_THREAD) for n in threads), threads
    assert not any(n.startswith(READING_THREAD) for n in plain_threads)  # the remote path
    assert got == plain  # every column of every record, in the same order
    stats = ds.stats()
    assert stats["bytes_fetched"] == 0 and stats["cache_hit_bytes"] > 0
    # and each record is its row as pyarrow.dataset reads it, every column
    rows = pads.dataset("cachedread/p", format="parquet", filesystem=s3.fs()).to_table()
    by_id = {r["id"]: r for r in rows.to_pylist()}
    assert len(got) == sum(SIZES) and all(r == by_id[r["id"]] for r in got)


def test_a_cached_epoch_in_batches_matches_an_uncached_one(
    s3: Any, tmp_path: Path, small_blocks: int
) -> None:
    options = s3.storage_options
    url = ShardIndex.build(upload(s3), storage_options=options)
    list(dataset(url, options, tmp_path / "n", 0, batch_size=64))
    got, threads = read(dataset(url, options, tmp_path / "n", 2, batch_size=64))
    plain, _ = read(dataset(url, options, None, 2, batch_size=64))
    assert any(n.startswith(READING_THREAD) for n in threads), threads
    assert len(got) == len(plain) > 1
    for a, b in zip(got, plain):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], torch.Tensor):
                assert torch.equal(a[name], b[name]), name
            else:
                assert a[name] == b[name], name


def test_a_reading_the_cache_holds_part_of_takes_the_remote_path(
    s3: Any, tmp_path: Path, small_blocks: int
) -> None:
    options = s3.storage_options
    url = ShardIndex.build(upload(s3), storage_options=options)
    list(dataset(url, options, tmp_path / "n", 0))
    blocks = sorted((tmp_path / "n").glob("*.blk"))
    for p in blocks[::3]:  # evicted, as a bounded cache would
        p.unlink()
    ds = dataset(url, options, tmp_path / "n", 1)
    got, threads = read(ds)
    assert not any(n.startswith(READING_THREAD) for n in threads), threads
    assert got == read(dataset(url, options, None, 1))[0]
    assert ds.stats()["bytes_fetched"] > 0  # the missing blocks, fetched again
    assert len(list((tmp_path / "n").glob("*.blk"))) == len(blocks)  # and kept


def test_every_byte_a_reading_fetches_is_counted_in_a_fresh_process(
    s3: Any, tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no footer in memory (an index loaded from a file), deciding whether the cache
    serves a reading reads nothing: every byte the endpoint serves is in the dataset's
    `bytes_fetched` (the footers once fetched uncounted at the reading's start, one by one)."""
    index = ShardIndex.build(upload(s3), storage_options=s3.storage_options)
    for epoch in range(2):
        monkeypatch.setattr(formats_parquet, "FOOTERS", FooterCache(1 << 20))
        with counting_proxy(s3.endpoint_url) as proxy:
            options = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = dataset(index, options, tmp_path / "n", epoch)
            got = list(ds)
            served = proxy.object_bytes
        assert got == list(dataset(index, s3.storage_options, None, epoch))
        assert ds.stats()["bytes_fetched"] == served
        assert (served > 0) == (epoch == 0)  # epoch 1: all from the cache


def test_footers_the_node_cache_holds_are_read_from_it(
    s3: Any, tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank whose process holds no footer of the shards it reads now (an index loaded
    from a file; with `locality="node"` a node's ranks trade shards between epochs) reads
    them from the node cache, which another rank filled: its epoch takes the cached path,
    fetching nothing, every record as an uncached read gives it."""
    url = upload(s3)
    saved = tmp_path / "index.arrow"
    ShardIndex.build(url, storage_options=s3.storage_options).save(str(saved))
    for epoch in range(2):  # a fresh process each: no footer in memory
        monkeypatch.setattr(formats_parquet, "FOOTERS", FooterCache(1 << 20))
        if epoch == 0:  # "another rank" of the node fills the cache
            list(dataset(ShardIndex.load(str(saved)), s3.storage_options, tmp_path / "n", 0))
    ds = dataset(ShardIndex.load(str(saved)), s3.storage_options, tmp_path / "n", 1)
    got, threads = read(ds)
    assert any(n.startswith(READING_THREAD) for n in threads), threads
    assert ds.stats()["bytes_fetched"] == 0
    assert got == read(dataset(ShardIndex.load(str(saved)), s3.storage_options, None, 1))[0]
