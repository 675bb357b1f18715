"""The read pipeline: pieces read group by group, in the sampler's order, within a memory
budget counted by the loader itself; records counted exactly however a consumer stops."""

from __future__ import annotations

import itertools
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.formats.parquet import meta as parquet_meta
from shardstream.loader.read.plan_reader import MemoryBudget, PlanReader
from shardstream.sampler import ShardSampler

from .datagen import record_id, write_dataset
from .helpers import check_resume

SIZES = [300, 0, 410, 170, 350, 260, 90, 333]


@pytest.fixture
def one_row_group_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row group its own read group (small test files would otherwise be one each)."""
    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 1)


def local(tmp_path: Path, payload: int = 0, row_group_size: int = 40) -> str:
    fs = fsspec.filesystem("file")
    write_dataset(fs, str(tmp_path / "d"), "parquet", SIZES, row_group_size, payload)
    return str(tmp_path / "d")


def source(
    request: pytest.FixtureRequest, tmp_path: Path, storage: str, bucket: str
) -> tuple[str, dict[str, Any]]:
    """(url, storage options) of the SIZES dataset, in row groups of 40: local, or in a new
    bucket of the test S3 server."""
    if storage == "local":
        return local(tmp_path), {}
    s3 = request.getfixturevalue("s3")
    fs = s3.fs()
    fs.mkdir(bucket)
    write_dataset(fs, f"{bucket}/d", "parquet", SIZES, row_group_size=40)
    return f"s3://{bucket}/d", s3.storage_options


def ids(items: Any) -> list[int]:
    out: list[int] = []
    for x in items:
        out += x["id"].tolist() if not isinstance(x["id"], int) else [record_id(x)]
    return out


@pytest.mark.usefixtures("one_row_group_a_group")
@pytest.mark.parametrize("storage", ["local", "s3"])
@pytest.mark.parametrize("batch_size", [None, 32])
@pytest.mark.parametrize("workers", [0, 2])
def test_pieces_are_read_group_by_group_in_the_samplers_order(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    storage: str,
    batch_size: int | None,
    workers: int,
) -> None:
    url, options = source(request, tmp_path, storage, "grouped")
    index = ShardIndex.build(url, options)
    for rank in range(2):
        ds = StreamingDataset(
            index, num_replicas=2, rank=rank, seed=9, batch_size=batch_size, storage_options=options
        )
        assert ds.groups[0] == [40] * 7 + [20]  # one read group a row group
        sampler = ShardSampler(index, 2, rank, seed=9, groups=ds.groups)
        got = ids(DataLoader(ds, batch_size=None, num_workers=workers))
        if workers == 0:
            assert got == list(sampler)
        else:
            assert Counter(got) == Counter(sampler)
            plans = [sampler.plan(w, workers, align=batch_size or 1) for w in range(workers)]
            offsets = sampler.offsets
            for plan in plans:  # each worker in its plan's order
                want = [
                    int(offsets[s]) + int(r)
                    for c in plan.chunks()
                    for s, r in zip(c.shards, c.rows)
                ]
                assert [i for i in got if i in set(want)] == want


@pytest.mark.usefixtures("one_row_group_a_group")
@pytest.mark.parametrize("storage", ["local", "s3"])
@pytest.mark.parametrize("batch_size", [None, 32])
def test_decoding_threads_read_the_same_order(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    storage: str,
    batch_size: int | None,
) -> None:
    """Remote shards have `decode_threads()` threads decoding ahead of the consumer; local
    Parquet is decoded by pyarrow's scanner (loader.read.scanning), whatever they say, and
    checked and shaped in the consumer: forced on, the reading is the same, in the same
    order, and a failing read still names its shard."""
    from shardstream.loader.read import decoding, reading

    url, options = source(request, tmp_path, storage, "threads")

    def read() -> list[int]:
        ds = StreamingDataset(url, seed=4, batch_size=batch_size, storage_options=options)
        return ids(ds)

    seen: set[str] = set()
    decode = PlanReader.decode

    def counted(self: Any, *args: Any) -> Any:
        seen.add(threading.current_thread().name)
        return decode(self, *args)

    monkeypatch.setattr(PlanReader, "decode", counted)
    want = read()
    if storage == "local":  # the scan's groups are finished by the consumer
        assert seen == {threading.main_thread().name}
    for threads in (1, 3):
        monkeypatch.setattr(decoding, "decode_threads", lambda local=True, n=threads: n)
        monkeypatch.setattr(reading, "decode_threads", lambda local=True, n=threads: n)
        seen.clear()
        assert read() == want
        if storage == "local":
            assert seen == {threading.main_thread().name}
        else:
            assert any(name.startswith("decode") for name in seen)  # threads did decode
    if storage == "local":  # a shard gone after indexing: the error names it
        ds = StreamingDataset(url, seed=4, batch_size=batch_size)
        (tmp_path / "d" / "part-00002.parquet").unlink()
        with pytest.raises(StaleIndexError, match="part-00002"):
            ids(ds)


@pytest.mark.usefixtures("one_row_group_a_group")
def test_records_are_counted_exactly_when_a_consumer_stops_inside_a_list(tmp_path: Path) -> None:
    """Records are handed out from lists of a few hundred; a state saved after any
    number of them resumes at exactly the next."""
    url = local(tmp_path)

    def make() -> StreamingDataset:
        return StreamingDataset(url, num_replicas=1, rank=0, seed=2, columns=["id", "text"])

    n = len(make())
    check_resume(make, positions=[1, 255, 256, 257, 700, n - 1], epoch=1, key=record_id)


@pytest.mark.usefixtures("one_row_group_a_group")
def test_batches_resume_exactly_with_groups(tmp_path: Path) -> None:
    url = local(tmp_path)

    def make() -> StreamingDataset:
        return StreamingDataset(url, num_replicas=2, rank=1, seed=2, batch_size=48)

    check_resume(make, positions=[1, 3, len(make()) - 1], key=lambda b: tuple(b["id"].tolist()))


def largest_group(ds: StreamingDataset) -> int:
    """Bytes the largest read group of the dataset holds once decoded (measured)."""
    fmt, fs = ds._format(), fsspec.filesystem("file")
    out = 0
    for shard, counts in zip(ds.index.shards, ds.groups):
        at = 0
        for n in counts:
            block = fmt.join([fmt.read(fs, shard, at, at + n, ds.columns)])
            out = max(out, fmt.nbytes(block))
            fmt.release(block)
            at += n
    return out


def test_the_memory_budget_bounds_the_bytes_held(tmp_path: Path, monkeypatch: Any) -> None:
    """Counted by the loader: decoded groups held plus groups being read stay within the
    budget but for one group (the one the consumer waits for is read even when it does
    not fit); a larger budget reads further ahead."""
    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 16 << 10)
    url = local(tmp_path, payload=400, row_group_size=20)  # groups of ~20 KB decoded
    index = ShardIndex.build(url)
    expected = list(range(sum(SIZES)))
    peaks = {}
    for budget in (150_000, 10_000_000):
        ds = StreamingDataset(index, batch_size=16, memory_budget=budget, window=2)
        assert sorted(ids(ds)) == expected
        peaks[budget] = ds.stats()["peak_held_bytes"]
    largest = largest_group(ds)
    assert 4 * largest < 150_000  # the budget holds a few groups
    assert 0 < peaks[150_000] <= 150_000 + largest
    assert peaks[10_000_000] > 2 * peaks[150_000]  # read further ahead


def test_with_no_budget_only_the_groups_needed_are_read(tmp_path: Path, monkeypatch: Any) -> None:
    """memory_budget=0: nothing is read ahead. The first batch needs the first group of
    each of the block's pieces and nothing more: the block is not read whole first."""
    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 1)
    fs = fsspec.filesystem("file")
    write_dataset(fs, str(tmp_path / "d"), "parquet", [4000] * 4, row_group_size=1000)
    index = ShardIndex.build(str(tmp_path / "d"))
    ds = StreamingDataset(index, batch_size=8, memory_budget=0, window=4)
    from shardstream.loader.storage.retry import bytes_fetched

    before = bytes_fetched()
    first = next(iter(ds))
    assert len(first["id"]) == 8
    plan = ds.sampler.plan()
    firsts: dict[int, int] = {}
    for p, g in plan.group_schedule(0):  # in need order: each piece's first group first
        firsts.setdefault(p, g)
    fmt = ds._format()

    def stored(p: int, rows: tuple[int, int]) -> int:
        return fmt.piece_bytes(index.shards[int(plan.shards[p])], *rows)

    needed = sum(stored(p, plan.group_rows(p, g)) for p, g in firsts.items())
    block = sum(stored(p, (int(plan.starts[p]), int(plan.stops[p]))) for p in range(4))
    assert len(firsts) == 4 and bytes_fetched() - before == needed <= block / 4 + 4096


def test_prefetch_is_a_deprecated_alias(tmp_path: Path) -> None:
    url = local(tmp_path)
    with pytest.warns(DeprecationWarning, match=r"prefetch=.*is deprecated.*memory_budget"):
        ds = StreamingDataset(url, prefetch=2, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = [record_id(r) for r in StreamingDataset(url, seed=1)]
    assert [record_id(r) for r in ds] == want
    with (
        pytest.raises(ValueError, match=r"memory_budget or the deprecated prefetch, not both"),
        pytest.warns(DeprecationWarning),
    ):
        StreamingDataset(url, prefetch=1, memory_budget=1 << 20)
    with pytest.raises(ValueError, match=r"memory_budget must be an int >= 0 \(bytes\), got -1"):
        StreamingDataset(url, memory_budget=-1)


@pytest.mark.usefixtures("one_row_group_a_group")
def test_the_slab_size_never_changes_the_records(tmp_path: Path) -> None:
    """Record mode gathers RECORD_SLAB records at once, batch mode SLAB: whatever the slab,
    the same whole records come in the same order, in parts of `step` (a slab of one
    step; one a little over it, cut by the groups held; and one larger than the run)."""
    url = local(tmp_path, payload=40, row_group_size=20)
    index = ShardIndex.build(url)
    ds = StreamingDataset(index)
    fmt = ds._format()
    sampler = ShardSampler(index, 1, 0, seed=3, groups=ds.groups, window=3)
    plan = sampler.plan()

    def records(slab: int) -> list[list[dict[str, Any]]]:
        reader = PlanReader(
            index, fmt, columns=None, storage_options={}, retry=ds.retry, read_threads=2
        )
        return [list(fmt.records(p)) for p in reader.parts([(plan, 5, 1800)], 16, slab=slab)]

    want = records(16)
    ends = set(itertools.accumulate(len(p) for p in want))
    assert max(len(p) for p in want) == 16 and set(range(16, 1795, 16)) <= ends
    flat = [r for p in want for r in p]
    assert [record_id(r) for r in flat] == [
        int(sampler.offsets[s]) + int(r)
        for c in plan.chunks(5, 1800)
        for s, r in zip(c.shards, c.rows)
    ]
    assert all(set(r) == set(flat[0]) and len(r["blob"]) == 40 for r in flat)  # whole records
    for slab in (40, 2048, 8192):
        assert records(slab) == want, slab


@pytest.mark.usefixtures("one_row_group_a_group")
@pytest.mark.parametrize("limit", [1 << 20, 100_000])
def test_wide_records_are_gathered_in_smaller_slabs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """A record slab is RECORD_SLAB records while its gathered columns hold at most
    RECORD_SLAB_BYTES, else SLAB (measured at the first slab): these records gather ~44
    bytes each (8,192 of them: ~360 KB), and the records are the same either way."""
    from shardstream.loader.read import plan_reader, reading

    monkeypatch.setattr(plan_reader, "RECORD_SLAB_BYTES", limit)
    root = tmp_path / "wide"
    write_dataset(fsspec.filesystem("file"), str(root), "parquet", [9000, 9000], 3000)
    sizes: list[int] = []
    gather = reading.Reading.gather

    def spy(self: Any, r: int, chunk: Any, lo: int, hi: int, *args: Any) -> Any:
        sizes.append(hi - lo)
        return gather(self, r, chunk, lo, hi, *args)

    monkeypatch.setattr(reading.Reading, "gather", spy)
    got = list(StreamingDataset(str(root), seed=5, window=2))
    # (slabs also end at the order's chunks and where a group is not read yet)
    if limit > 360_000:
        assert plan_reader.SLAB < max(sizes) <= plan_reader.RECORD_SLAB
    else:
        assert max(sizes[1:]) <= plan_reader.SLAB
    assert sorted(record_id(r) for r in got) == list(range(18000))
    want = {r["id"]: r for r in pq.read_table(str(root)).to_pylist()}
    assert all(r == want[r["id"]] for r in got)  # whole records


def test_readers_share_one_budget(tmp_path: Path, monkeypatch: Any) -> None:
    """Two readers given one MemoryBudget (as a mixture's streams would be) are bounded
    together: within the budget but for the groups each needs at once (at most two a
    piece of its block)."""
    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 16 << 10)
    url = local(tmp_path, payload=400, row_group_size=20)
    index = ShardIndex.build(url)
    ds = StreamingDataset(index, batch_size=16)
    shared = MemoryBudget(100_000)
    plan = ShardSampler(index, 1, 0, groups=ds.groups, window=2).plan()

    def reader() -> PlanReader:
        kw: dict[str, Any] = {"storage_options": {}, "retry": ds.retry, "read_threads": 4}
        return PlanReader(index, ds._format(), columns=None, memory_budget=shared, **kw)

    a = reader().parts([(plan, 0, 1000)], 16)
    b = reader().parts([(plan, 1000, 1900)], 16)
    got: list[int] = []
    forced = 2 * 2 * 2 * largest_group(ds)  # readers x pieces x groups a piece
    for part in itertools.chain.from_iterable(itertools.zip_longest(a, b)):
        if part is not None:
            got += part["id"].tolist()
        assert shared.held <= shared.limit + forced
    assert len(got) == 1900 == len(set(got))
    assert shared.held == 0 and 0 < shared.peak <= shared.limit + forced


@pytest.mark.usefixtures("one_row_group_a_group")
def test_the_first_batchs_groups_are_fetched_before_the_rest(s3: Any) -> None:
    """Off local disk, nothing but the first block's first group of each piece is fetched
    until the first slab is gathered: sent out with the whole budget's requests, the first
    batch would share the store's bandwidth with all of them.
    Behind a 40 ms proxy no answer comes sooner than 40 ms after the first GET arrived, so
    every GET that arrived before then is one of those (at most one a piece: each alone);
    the rest came after."""
    from tests.s3proxy import Shaping, counting_proxy

    fs = s3.fs()
    fs.mkdir("opening")
    write_dataset(fs, "opening/d", "parquet", SIZES, row_group_size=40)
    index = ShardIndex.build("s3://opening/d", s3.storage_options)  # footers now cached
    with counting_proxy(s3.endpoint_url, shaping=Shaping(latency_ms=40)) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset(index, storage_options=opts, batch_size=64, seed=4)
        got = ids(ds)
    assert got == list(ShardSampler(index, seed=4, groups=ds.groups))
    spans = [(a, path) for m, path, _, a, _ in proxy.timeline if m == "GET"]
    answered = min(a for a, _ in spans) + 0.9 * 0.040  # the soonest any answer is in
    early = [path for a, path in spans if a < answered]
    pieces = sum(1 for n in SIZES if n)  # one block: every non-empty shard's piece
    assert 1 <= len(early) <= pieces and len(set(early)) == len(early)  # a shard each
    assert len(spans) > pieces


@pytest.mark.usefixtures("one_row_group_a_group")
def test_a_shards_groups_are_fetched_together_from_s3(s3: Any) -> None:
    """Off local disk, the groups of a shard that are started together are fetched in one
    coalesced read (object stores want fewer, larger requests), each still decoded alone;
    the first group of each piece of the first block alone (the first batch's)."""
    from tests.s3proxy import counting_proxy

    fs = s3.fs()
    fs.mkdir("merged")
    write_dataset(fs, "merged/d", "parquet", SIZES, row_group_size=40)
    index = ShardIndex.build("s3://merged/d", s3.storage_options)  # footers now cached
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset(index, storage_options=opts, batch_size=64, seed=4)
        got = ids(ds)
    assert sorted(got) == list(range(sum(SIZES)))
    assert got == list(ShardSampler(index, seed=4, groups=ds.groups))
    groups = sum(len(g) for g in ds.groups)
    gets = [r for r in proxy.requests if r[0] == "GET"]
    shards = sum(1 for n in SIZES if n)
    # two GETs a shard at most: the first block's first groups (all 7 shards' here) are
    # fetched alone, before anything else (the first batch waits for their bytes only),
    # the rest of each shard together
    assert groups == 52 and len(gets) <= 2 * shards < groups
