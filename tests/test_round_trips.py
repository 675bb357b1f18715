"""stats()'s round trips before the first item (loader.storage.trips): how many storage
requests a reader made before its first item, the construction's included, and how many
stood in line; checked against what a proxy in front of moto saw."""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import ShardIndex, Stream, StreamingDataset
from shardstream.loader.formats.parquet.meta import FOOTERS, SCANS
from shardstream.loader.index.beside import INDEX_NAME, save_beside
from tests.s3proxy import IN_LINE, CountingProxy, Shaping, counting_proxy, least_in_line

from .conftest import REPO, torchrun
from .datagen import SIZES, parquet_table, write_dataset
from .rowdata import rows_of


def _bucket(s3: Any, name: str) -> None:
    fs = s3.fs()
    if not fs.exists("trips"):
        fs.mkdir("trips")
    write_dataset(fs, f"trips/{name}", "parquet", SIZES, row_group_size=40)


def _saved(s3: Any, name: str) -> None:
    _bucket(s3, name)
    index = ShardIndex.build(f"s3://trips/{name}", s3.storage_options)
    save_beside(index, f"s3://trips/{name}/{INDEX_NAME}", s3.storage_options)
    _fresh()


def _fresh() -> None:
    """Forget the footers the index's build parsed, as a fresh process would not hold them
    (holding them, a read fetched no footer: the count missed what a new job waits for)."""
    FOOTERS.clear()
    SCANS.clear()


def _first_batch(
    s3: Any, source: str, want: int
) -> tuple[dict[str, Any], CountingProxy, float, float]:
    """stats() once rank 0 of 2 reading `source` through a latency proxy has its first
    batch, the proxy, and the monotonic times the dataset's construction began and the
    batch came: of a start whose requests stood `want` in line as the proxy saw them, of
    up to 3 new jobs' (least_in_line)."""
    return least_in_line(lambda: _start(s3, source), lambda got: got[1].in_line(*got[2:]), want)


def _start(s3: Any, source: str) -> tuple[dict[str, Any], CountingProxy, float, float]:
    _fresh()
    with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        t0 = time.monotonic()
        ds = StreamingDataset(source, storage_options=opts, batch_size=64, num_replicas=2, rank=0)
        next(iter(ds))
        t1 = time.monotonic()
    return ds.stats(), proxy, t0, t1


def _made(proxy: CountingProxy, t0: float, t1: float) -> list[Any]:
    """The requests that reached the proxy in [t0, t1]."""
    return [r for r in proxy.timeline if t0 <= r[3] <= t1]


def test_from_a_saved_index_the_first_batch_is_two_round_trips(s3: Any) -> None:
    """The index's GET, then the first row groups with their shards' footers, sent
    together (their places in the saved index; the version checked in the same requests:
    If-Match), and nothing else in line: no footer first, no HEAD. The prefix's first
    listing page goes beside the index's GET (for a build, were none there), not after."""
    _saved(s3, "d")
    st, proxy, t0, t1 = _first_batch(s3, "s3://trips/d", 2)
    made = _made(proxy, t0, t1)
    assert st["first_in_line"] == 2 == proxy.in_line(t0, t1)
    index = [r for r in made if r[:2] == ("GET", f"/trips/d/{INDEX_NAME}")]
    listing = _pages(proxy)  # (the proxy's timeline holds a request once answered)
    assert len(index) == 1 and len(listing) <= 1
    assert all(r[3] < index[0][4] for r in listing)  # sent with the index's GET, not after
    assert min(r[3] for r in made) >= min(r[3] for r in index + listing)  # nothing before
    others = [r for r in made if r not in listing]
    assert all(method == "GET" and rng for method, _, rng, *_ in others)  # ranged reads only
    assert 2 <= st["first_requests"] <= len(made)  # (the listing page: if answered in time)
    assert 0 < st["first_item_s"] < t1 - t0


def _pages(proxy: CountingProxy) -> list[Any]:
    """The listing pages the proxy has answered."""
    return [r for r in proxy.timeline if "list-type=2" in r[1]]


def test_a_saved_index_stops_the_listing_sent_beside_its_look(s3: Any) -> None:
    """A prefix of 2,500 more files than shards (3 listing pages) with an index beside its
    shards: the listing sent with the look for the index stops once the index is there (no
    page asked after the one in flight), and the first batch is still 2 in line, its rows
    the files' own."""
    _saved(s3, "big")
    fs = s3.fs()
    fs.pipe({f"trips/big/_extra/{k:05d}.txt": b"x" for k in range(2500)})

    def start() -> tuple[StreamingDataset, Any, CountingProxy]:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset("s3://trips/big", storage_options=opts, batch_size=64)
            batch = next(iter(ds))
            # the page in flight is answered (moto lists a large bucket slowly when loaded);
            # a page asked after the drop would then reach the proxy within the second after
            deadline = time.monotonic() + 30
            while not _pages(proxy) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
        return ds, batch, proxy

    _, batch, proxy = least_in_line(start, lambda got: got[0].stats()["first_in_line"], 2)
    assert 1 <= len(_pages(proxy)) <= 2
    want = {r["id"]: r for r in pq.read_table("trips/big", filesystem=fs).to_pylist()}
    rows = list(rows_of(batch, batch=True))
    assert len(rows) == 64 and all(row == want[row["id"]] for row in rows)


def test_a_saved_index_start_waits_for_no_listing(s3: Any) -> None:
    """The listing page sent with the look for the index is answered 3 s late (a store slow
    to list): the index is there, the listing is dropped in flight, and the first batch
    comes before that answer, 2 round trips in line."""
    _saved(s3, "slow")
    shaping = Shaping(latency_ms=IN_LINE.latency_ms, listing_ms=3000)

    def start() -> tuple[StreamingDataset, Any, list[Any]]:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=shaping) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset("s3://trips/slow", storage_options=opts, batch_size=64)
            batch = next(iter(ds))
            return ds, batch, [r for r in proxy.timeline if "list-type=" in r[1]]

    _, batch, answered = least_in_line(start, lambda got: got[0].stats()["first_in_line"], 2)
    assert not answered
    want = {r["id"]: r for r in pq.read_table("trips/slow", filesystem=s3.fs()).to_pylist()}
    rows = list(rows_of(batch, batch=True))
    assert len(rows) == 64 and all(row == want[row["id"]] for row in rows)


def test_a_first_batch_over_several_groups_sends_their_reads_together(s3: Any) -> None:
    """A first batch of 64 records of 20 KB from one shard read in storage order spans 5
    read groups (of at least 256 KiB): the groups it needs go out together once the
    consumer needs them, not each after the one before came (that was 6 in line)."""
    fs = s3.fs()
    fs.mkdir("trips")
    write_dataset(fs, "trips/wide", "parquet", [200], row_group_size=2, payload=20_000)
    index = ShardIndex.build("s3://trips/wide", s3.storage_options)
    save_beside(index, f"s3://trips/wide/{INDEX_NAME}", s3.storage_options)

    def start() -> tuple[StreamingDataset, Any, CountingProxy]:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset(
                "s3://trips/wide", storage_options=opts, batch_size=64, shuffle=False
            )
            return ds, next(iter(ds)), proxy

    _, batch, proxy = least_in_line(start, lambda got: got[0].stats()["first_in_line"], 2)
    assert list(rows_of(batch, batch=True)) == parquet_table(0, 200, 20_000)[:64].to_pylist()
    reads = sorted((r for r in proxy.timeline if r[1].endswith(".parquet")), key=lambda r: r[3])
    assert reads[1][3] < reads[0][4]  # the second read was sent before the first came


def test_without_an_index_the_round_trips_are_counted_as_the_proxy_sees_them(s3: Any) -> None:
    """No saved index: the look for one and the listing (sent together), the footers
    (together), then the first row groups: three in line (four with the listing after
    the look)."""
    _bucket(s3, "e")
    st, proxy, t0, t1 = _first_batch(s3, "s3://trips/e", 3)
    made = _made(proxy, t0, t1)
    assert st["first_in_line"] == 3 == proxy.in_line(t0, t1)
    assert len([r for r in made if "list-type=2" in r[1]]) == 1  # the one sent ahead, used
    footers = len([s for s in SIZES if s > 0])  # (an empty shard's footer is read too)
    assert footers + 3 <= st["first_requests"] <= len(made)


@pytest.mark.parametrize("streams", [1, 2])
def test_ranks_indexing_together_read_their_first_shards_footers_while_indexing(
    s3: Any, streams: int
) -> None:
    """No saved index, two ranks under torchrun: rank 0 looks for an index (a mixture's
    streams' all at once) and lists; each rank scans its share of the footers, cut along
    the epoch's shard order (a mixture: each stream's first pass), with those of the shards
    its span begins and ends in; then its first row groups. No footer is read again on the
    way (a share cut along the listing's order made it one round trip more: 5 and 3; a
    mixture of two 8 and 4, and 7 and 3 while its streams' looks went one after the
    other; each listing after its look: 4 and 2, 6 and 3)."""
    fs = s3.fs()
    fs.mkdir("trips")
    sources = []
    for k in range(streams):
        write_dataset(fs, f"trips/ranks{k}", "parquet", [30] * 8, row_group_size=10)
        sources.append(f"s3://trips/ranks{k}")

    def start() -> list[int]:
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            script = REPO / "tests" / "dist" / "first_batch_trips.py"
            out = torchrun(script, proxy.url, *sources)
        return [
            json.loads(line.split(" ", 1)[1])["in_line"]
            for o in out
            for line in o.splitlines()
            if line.startswith("TRIPS")
        ]

    # rank 0: the looks for an index, each with its listing, then per stream the footers;
    # rank 1: per stream the footers; then each its first row groups (the sum of the two
    # least of up to 3 runs: neither can stand fewer in line than it waited for)
    assert least_in_line(start, sum, 2 * streams + 3) == [streams + 2, streams + 1]


@pytest.mark.parametrize("saved", [True, False])
def test_every_rank_opens_its_client_while_rank_0_looks_for_the_index(s3: Any, saved: bool) -> None:
    """Two ranks under torchrun: rank 1 builds its S3 client (s3fs's import and a botocore
    client, ~0.5 s of CPU on a busy machine) on a thread while it waits for rank 0's look
    for a saved index, and has it once constructed: it stands neither between rank 0's
    answer and the listing's broadcast (no saved index: before, every rank waited 0.6-0.7 s
    there, 4 ranks on 2 cores) nor before rank 1's first read (a saved index: before, rank
    1 had no client once constructed). Without a saved index rank 1 connected before this
    too, after rank 0's answer: that case fails on no older code, it guards the path."""
    name = f"clients{int(saved)}"
    if saved:
        _saved(s3, name)
    else:
        _bucket(s3, name)
    out = torchrun(
        REPO / "tests" / "dist" / "rank_clients.py", s3.endpoint_url, f"s3://trips/{name}"
    )
    got = [
        json.loads(line.split(" ", 1)[1])
        for o in out
        for line in o.splitlines()
        if line.startswith("CLIENT")
    ]
    assert [g["rank"] for g in got] == [0, 1]
    assert all(g["imported"] and g["client"] and g["rows"] == 16 for g in got), got


def test_a_mixtures_streams_are_indexed_together(s3: Any) -> None:
    """One process, two streams behind a latency proxy: their indexes are looked for (and
    listed and scanned) at once, each step one round trip for both: 1 in line from saved
    indexes, 2 without (each listing sent with its look; 3 with the listings after the
    looks; 2 and 6 one stream after the other); then the first row groups: 2 and 3 in all.
    The first batch (64 rows of 40-row groups, from both streams) needs only the groups
    the streams' openings send (each stream's first part is the batch's most, not a step
    of 2,048: then a stream asked for the groups beyond its first once those were started,
    on a busy machine after the first answers, one more in line 1 in 20-50 runs)."""
    for name in ("m0", "m1"):
        _saved(s3, name)
    for name in ("n0", "n1"):
        _bucket(s3, name)

    def start(
        names: tuple[str, str],
    ) -> tuple[StreamingDataset, CountingProxy, float, float, float]:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            streams = [Stream(f"s3://trips/{n}", weight=1.0) for n in names]
            t0 = time.monotonic()
            ds = StreamingDataset(streams, storage_options=opts, batch_size=64)
            built = time.monotonic()
            next(iter(ds))
            return ds, proxy, t0, built, time.monotonic()

    for names, want in ((("m0", "m1"), 2), (("n0", "n1"), 3)):
        got = least_in_line(partial(start, names), lambda g: g[1].in_line(g[2], g[4]), want)
        ds, proxy, t0, built, t1 = got
        assert proxy.in_line(t0, built) == want - 1, names  # the streams' steps together
        assert ds.stats()["first_in_line"] == want, names
        assert proxy.in_line(t0, t1) == want, names


def test_a_local_mixtures_streams_are_indexed_on_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local streams' footers are Python's work: threads would only share the GIL out (3
    streams, 16 footers: 18 ms against 13), so they are indexed one after the other here;
    remote streams on threads of their own (the test above)."""
    for name in ("l0", "l1", "l2"):
        write_dataset(fsspec.filesystem("file"), str(tmp_path / name), "parquet", SIZES, 40)
    threads: list[str] = []
    real = ShardIndex.resolve.__func__  # type: ignore[attr-defined]

    def spy(cls: type[ShardIndex], *args: Any, **kwargs: Any) -> ShardIndex:
        threads.append(threading.current_thread().name)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(ShardIndex, "resolve", classmethod(spy))
    streams = [Stream(str(tmp_path / n), weight=1.0) for n in ("l0", "l1", "l2")]
    ds = StreamingDataset(streams, batch_size=64)
    assert threads == [threading.current_thread().name] * 3
    want = {r["id"]: r for r in pq.read_table(tmp_path / "l0").to_pylist()}  # (l1, l2 alike)
    got = [row for b in ds for row in rows_of(b, batch=True)]
    assert len(got) == 3 * sum(SIZES) and len(ds) == -(-len(got) // 64)
    for row in got:
        assert {k: v for k, v in row.items() if k != "__stream__"} == want[row["id"]]


def test_dataloader_workers_each_count_the_construction_and_their_own(s3: Any) -> None:
    _saved(s3, "w")
    # answers 150 ms late: two forked workers' first reads, sent together, overlap even
    # when a loaded machine starts a worker's fetching thread late (it once failed at 40)

    def start() -> StreamingDataset:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset("s3://trips/w", storage_options=opts, batch_size=32)
            loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
            assert sum(len(b["id"]) for b in loader) == sum(SIZES)
        return ds

    # the index's GET (in the main process), a worker's reads
    st = least_in_line(start, lambda ds: ds.stats()["first_in_line"], 2).stats()
    assert st["first_requests"] >= 2


def test_local_files_are_no_round_trips(tmp_path: Path) -> None:
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "d"), "parquet", SIZES, 40)
    ds = StreamingDataset(str(tmp_path / "d"), batch_size=64)
    next(iter(ds))
    st = ds.stats()
    assert st["first_requests"] == 0 == st["first_in_line"]
    assert st["first_item_s"] > 0


def test_the_construction_counts_in_the_first_pass_only(s3: Any) -> None:
    _saved(s3, "p")

    def start() -> list[int]:
        _fresh()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset("s3://trips/p", storage_options=opts, batch_size=64)
            next(iter(ds))
            first = ds.stats()["first_in_line"]
            ds.reset_stats()
            next(iter(ds))
            return [first, ds.stats()["first_in_line"]]

    # the second pass: its reads alone, the index is loaded (neither pass can count fewer
    # than it waited for, so their sum's least of up to 3 runs is each one's)
    assert least_in_line(start, sum, 3) == [2, 1]


def test_a_tar_without_an_index_is_walked_in_large_blocks_sent_together(s3: Any) -> None:
    """A tar of small members (6 MiB: its bodies are read, not skipped) is walked from its
    first 1 MiB and then the rest in 2 MiB reads sent together (loader.formats.tar.scan
    REMOTE_SCAN), never 1 MiB after 1 MiB: the look for an index with the listing, those
    two, then the first batch's read."""
    fs = s3.fs()
    fs.mkdir("trips")
    write_dataset(fs, "trips/t", "tar", [3000])
    size = fs.info("trips/t/part-00000.tar")["size"]
    assert 3 << 20 < size < 9 << 20  # more than the first 1 MiB and 1 MiB; one readahead
    st, proxy, t0, t1 = _first_batch(s3, "s3://trips/t", 4)
    assert st["first_in_line"] == 4 == proxy.in_line(t0, t1)
    spans = [
        rng.removeprefix("bytes=").split("-") for path, rng in proxy.gets if path.endswith(".tar")
    ]
    walk = spans[:-1]  # the last: the first batch's read, one request for its range
    assert walk and max(int(b) + 1 - int(a) for a, b in walk) <= 2 << 20  # in pieces
