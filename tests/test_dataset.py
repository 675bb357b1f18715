"""StreamingDataset over local and S3 shards, Parquet and tar, with DataLoader workers."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from torch.utils.data import DataLoader

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.sampler import ShardSampler

from .datagen import SIZES, record_id, write_dataset

N = sum(SIZES)


def make_source(storage: str, fmt: str, tmp_path: Path, s3: Any = None) -> tuple[str, dict]:
    if storage == "local":
        write_dataset(fsspec.filesystem("file"), str(tmp_path / "data"), fmt)
        return str(tmp_path / "data"), {}
    fs = s3.fs()
    fs.mkdir("shards")
    write_dataset(fs, "shards/train", fmt)
    return "s3://shards/train", s3.storage_options


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def source(request: pytest.FixtureRequest, storage: str, tmp_path: Path) -> Any:
    def make(fmt: str) -> tuple[str, dict]:
        s3 = request.getfixturevalue("s3") if storage == "s3" else None
        return make_source(storage, fmt, tmp_path, s3)

    return make


def read_ids(ds: StreamingDataset, workers: int) -> list[int]:
    return [record_id(r) for r in DataLoader(ds, batch_size=None, num_workers=workers)]


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_and_workers_read_exactly_their_records(
    source: Any, fmt: str, world: int, workers: int
) -> None:
    url, options = source(fmt)
    index = ShardIndex.build(url, options)
    assert index.shard_sizes.tolist() == SIZES
    for drop_last in (True, False):
        seen: Counter[int] = Counter()
        length = N // world if drop_last else math.ceil(N / world)
        for rank in range(world):
            kw = dict(num_replicas=world, rank=rank, seed=7, drop_last=drop_last)
            ds = StreamingDataset(index, storage_options=options, **kw)
            ids = read_ids(ds, workers)
            sampler = ShardSampler(SIZES, **kw)
            assert len(ds) == len(ids) == len(sampler) == length
            assert Counter(ids) == Counter(sampler)  # exactly the sampler's records
            if workers == 0:
                assert ids == list(sampler)  # ... in the sampler's order
            seen += Counter(ids)
        if drop_last:
            assert max(seen.values()) == 1 and sum(seen.values()) == world * length
        else:
            assert set(seen) == set(range(N)) and sum(seen.values()) == world * length
    # deterministic, and a new epoch is a new order
    ds = StreamingDataset(index, num_replicas=world, rank=0, seed=7, storage_options=options)
    first = read_ids(ds, workers)
    assert read_ids(ds, workers) == first
    ds.set_epoch(1)
    again = read_ids(ds, workers)
    assert again != first and len(again) == len(first)


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_s3_and_local_give_the_same_order(s3: Any, tmp_path: Path, fmt: str) -> None:
    local = make_source("local", fmt, tmp_path)
    remote = make_source("s3", fmt, tmp_path, s3)
    for rank in range(3):
        got = [
            read_ids(StreamingDataset(u, num_replicas=3, rank=rank, storage_options=o), 2)
            for u, o in (local, remote)
        ]
        assert got[0] == got[1]


def test_parquet_records_and_column_projection(tmp_path: Path) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    full = next(iter(StreamingDataset(url, shuffle=False)))
    assert full == {"id": 0, "value": 0.0, "tokens": [0, 1, 2], "text": "record 0"}
    only = list(StreamingDataset(url, columns=["text", "id"], shuffle=False))
    assert only[5] == {"text": "record 5", "id": 5}
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the shards"):
        StreamingDataset(url, columns=["nope"])


def test_tar_samples_follow_webdataset_and_decode(tmp_path: Path) -> None:
    url, _ = make_source("local", "tar", tmp_path)
    sample = next(iter(StreamingDataset(url, shuffle=False)))
    assert sample["__key__"] == "sample000000"
    assert sample["__url__"].endswith("part-00000.tar")
    assert (sample["cls"], sample["txt"]) == (b"0", b"record 0")
    decoded = next(iter(StreamingDataset(url, shuffle=False, decode=True)))
    assert (decoded["cls"], decoded["txt"]) == (0, "record 0")
    only = next(iter(StreamingDataset(url, shuffle=False, columns=["txt"])))
    assert set(only) == {"__key__", "__url__", "txt"}


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_tensors_and_only_the_last_is_short(tmp_path: Path, workers: int) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    ds = StreamingDataset(url, num_replicas=2, rank=1, batch_size=16, seed=3)
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(batches) == len(ds) == math.ceil(63 / 16)
    assert [len(b["id"]) for b in batches] == [16, 16, 16, 15]
    first = batches[0]
    assert first["id"].dtype == torch.int64 and first["value"].dtype == torch.float32
    assert first["tokens"].shape == (16, 3) and first["tokens"].dtype == torch.int32
    assert torch.equal(first["tokens"][:, 0].long(), first["id"])
    assert isinstance(first["text"], list) and first["text"][0] == f"record {first['id'][0]}"
    ids = [int(i) for b in batches for i in b["id"]]
    assert Counter(ids) == Counter(ShardSampler(SIZES, 2, 1, seed=3))


def test_tar_batches(tmp_path: Path) -> None:
    url, _ = make_source("local", "tar", tmp_path)
    batches = list(StreamingDataset(url, batch_size=50, decode=True, shuffle=False))
    assert [len(b["__key__"]) for b in batches] == [50, 50, 25]
    assert torch.equal(batches[0]["cls"], torch.arange(50))


def test_set_epoch_reaches_persistent_workers(tmp_path: Path) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    ds = StreamingDataset(url, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append([record_id(r) for r in loader])
    ref = StreamingDataset(url, seed=1)
    ref.set_epoch(1)
    expected = [record_id(r) for r in DataLoader(ref, batch_size=None, num_workers=2)]
    assert epochs[1] == expected and epochs[0] != epochs[1]


def test_workers_started_with_spawn(tmp_path: Path) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    ds = StreamingDataset(url, num_replicas=2, rank=0)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert Counter(record_id(r) for r in loader) == Counter(ShardSampler(SIZES, 2, 0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive int or None, got 0"),
        ({"num_replicas": 2, "rank": 5}, r"Invalid rank 5"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    with pytest.raises(ValueError, match=message):
        StreamingDataset(url, **kwargs)


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_bytes_fetched_counts_the_row_groups_read(
    request: pytest.FixtureRequest, storage: str, tmp_path: Path
) -> None:
    from shardstream.loader.storage.retry import bytes_fetched

    s3 = request.getfixturevalue("s3") if storage == "s3" else None
    url, options = make_source(storage, "parquet", tmp_path, s3)
    index = ShardIndex.build(url, options)
    before = bytes_fetched()
    ds = StreamingDataset(index, storage_options=options)
    assert sorted(record_id(r) for r in ds) == list(range(sum(SIZES)))
    read = [s for s in index.shards if s.num_records]  # a 0-record shard is not opened
    row_groups = sum(sum(s.details["row_group_bytes"]) for s in read)
    assert bytes_fetched() - before == row_groups  # footers: parsed once, by the build


def test_a_rank_fetches_about_its_share_of_the_bytes(s3: Any) -> None:
    """A rank of 16 over 8 Parquet shards: ~1/16 of the bytes, index building included."""
    from tests.s3proxy import counting_proxy

    fs = s3.fs()
    fs.mkdir("big")
    # 8 shards of ~1.6 MB: big enough that footers and listings are a small part
    write_dataset(fs, "big/set", "parquet", sizes=[8000] * 8, row_group_size=1000, payload=200)
    total = sum(fs.size(p) for p in fs.ls("big/set"))
    share = total / 16
    for rank in (0, 5, 15):
        with counting_proxy(s3.endpoint_url) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset("s3://big/set", num_replicas=16, rank=rank, storage_options=opts)
            ids = read_ids(ds, 0)
        assert len(ids) == 4000
        ratio = proxy.bytes_served / share
        print(f"rank {rank}: fetched {proxy.bytes_served} bytes, {ratio:.3f} x its share")
        assert 0.9 < ratio < 1.25, (rank, proxy.bytes_served, share)


@pytest.mark.parametrize("workers", [0, 2])
def test_under_torchrun_ranks_come_from_the_process_group(tmp_path: Path, workers: int) -> None:
    from .conftest import REPO, torchrun

    url, _ = make_source("local", "parquet", tmp_path)
    out = torchrun(REPO / "tests" / "dist" / "dataset_allgather.py", url, str(workers), nproc=3)
    line = next(x for x in out[0].splitlines() if x.startswith("IDS "))
    per_rank = json.loads(line[4:])
    assert [len(ids) for ids in per_rank] == [N // 3] * 3
    flat = [i for ids in per_rank for i in ids]
    assert len(set(flat)) == len(flat)  # drop_last: exactly once across ranks
    for rank, ids in enumerate(per_rank):
        assert Counter(ids) == Counter(ShardSampler(SIZES, 3, rank, seed=11, drop_last=True))


def test_worker_batches_pack_their_tensors_into_one_storage(tmp_path: Path) -> None:
    url, _ = make_source("local", "parquet", tmp_path)
    ds = StreamingDataset(url, batch_size=8, seed=3)
    direct = list(ds)  # num_workers=0: one tensor, one storage per column
    storages = {direct[0][k].untyped_storage().data_ptr() for k in ("id", "value", "tokens")}
    assert len(storages) == 3
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    for b in batches:
        tensors = [b["id"], b["value"], b["tokens"]]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
        assert b["value"].tolist() == [i / 2 for i in b["id"].tolist()]
        assert b["tokens"].tolist() == [[i, i + 1, i + 2] for i in b["id"].tolist()]
        assert b["text"] == [f"record {i}" for i in b["id"].tolist()]
    ids = sorted(i for b in batches for i in b["id"].tolist())
    assert ids == sorted(i for b in direct for i in b["id"].tolist()) == list(range(sum(SIZES)))
