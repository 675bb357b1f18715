"""What every object store gives a dataset, checked on each (S3 on moto, GCS on
gcp-storage-emulator, Azure on Azurite, a plain HTTP server: the `store` fixture), over
real HTTP, through a proxy (scripts/s3proxy.py) where a test needs a server that
misbehaves: the same records as a local read, only the row groups a rank needs, a
rewritten shard refused, a range other than the one asked refused, credentials missing or
refused named, a dead endpoint a named error, an epoch that survives 503s, and the same
round trips before the first batch."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem
from torch.utils.data import DataLoader

from shardstream.loader import (
    RetryPolicy,
    ShardError,
    ShardIndex,
    StaleIndexError,
    StreamingDataset,
)
from shardstream.loader.formats.parquet.meta import FOOTERS, SCANS
from shardstream.loader.index.beside import INDEX_NAME, save_beside
from shardstream.loader.storage.ranged_get import RangeIgnoredError
from shardstream.loader.storage.trips import in_line
from tests.s3proxy import IN_LINE, CountingProxy, Faults, counting_proxy, least_in_line

from .datagen import record_id, write_dataset
from .stores import Store
from .test_faults import read_in_thread

SIZES = [300, 0, 410, 170, 350, 90, 260, 120]  # 8 shards, one empty
GROUP = 40  # rows per row group
QUICK = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)


def upload(store: Store, fmt: str, sizes: list[int] = SIZES, payload: int = 0) -> str:
    """The dataset written into the store; its folder's relative name."""
    rel = f"data-{fmt}"
    write_dataset(
        store.fs(), store.path(rel), fmt, sizes=sizes, row_group_size=GROUP, payload=payload
    )
    return rel


def local_copy(tmp_path: Path, fmt: str, sizes: list[int] = SIZES, payload: int = 0) -> str:
    root = str(tmp_path / f"local-{fmt}")
    write_dataset(LocalFileSystem(), root, fmt, sizes=sizes, row_group_size=GROUP, payload=payload)
    return root


@contextlib.contextmanager
def proxied(store: Store, faults: Faults | None = None) -> Iterator[tuple[CountingProxy, str]]:
    """A proxy in front of the store's server: (proxy, the URL of the data through it)."""
    with counting_proxy(store.endpoint, faults) as proxy:
        yield proxy, proxy.url


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("__")}  # __url__ names the store


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_and_workers_read_what_a_local_read_gives(
    store: Store, tmp_path: Path, fmt: str, workers: int
) -> None:
    rel = upload(store, fmt)
    local = local_copy(tmp_path, fmt)
    seen: list[int] = []
    counts = []
    for rank in range(2):
        kw: dict[str, Any] = {"num_replicas": 2, "rank": rank, "seed": 5, "drop_last": False}
        remote = StreamingDataset(store.url(rel), storage_options=store.options(), **kw)
        rows = list(DataLoader(remote, batch_size=None, num_workers=workers))
        expected = list(
            DataLoader(StreamingDataset(local, **kw), batch_size=None, num_workers=workers)
        )
        assert [_plain(r) for r in rows] == [_plain(r) for r in expected]  # every column, in order
        seen += [record_id(r) for r in rows]
        counts.append(len(rows))
    assert sorted(seen) == list(range(sum(SIZES)))  # every record once
    assert counts[0] == counts[1]  # padded to equal counts, as DistributedSampler does


def test_a_rank_fetches_only_the_row_groups_it_reads(store: Store) -> None:
    sizes = [400] * 4
    rel = upload(store, "parquet", sizes=sizes, payload=64)
    with proxied(store) as (proxy, at):
        options = store.options(at)
        index = ShardIndex.build(store.url(rel, at), options)
        proxy.requests.clear()  # what the build asked is not the rank's
        ds = StreamingDataset(index, num_replicas=4, rank=1, seed=2, storage_options=options)
        ids = [record_id(r) for r in ds]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    groups = {(i // 400, (i - starts[i // 400]) // GROUP) for i in ids}
    want = sum(index.shards[s].details["row_group_bytes"][g] for s, g in groups)
    assert len(ids) == 400
    # GCS's emulator names no generation in its answers: a metadata GET per shard read
    # proves it (loader.storage.gcs); those JSON answers are not shard bytes
    data = [(path, n) for method, path, n in proxy.requests if method == "GET"]
    metadata = [path for path, _ in data if path.startswith("/storage/v1/")]
    assert sum(n for path, n in data if path not in metadata) == want  # nothing more
    assert len(metadata) == (len({s for s, _ in groups}) if store.kind == "gcs" else 0)


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"], indirect=True)
def test_every_read_asks_for_the_indexed_version_itself(store: Store) -> None:
    """The version travels in each ranged GET (S3 and Azure: If-Match, GCS:
    ifGenerationMatch), so the store refuses a rewritten shard with a 412: no HEAD or
    metadata request per shard per read (a plain HTTP server has no such condition: its
    version is checked after the read)."""
    rel = upload(store, "parquet", sizes=[200, 150])
    with proxied(store) as (proxy, at):
        index = ShardIndex.build(store.url(rel, at), store.options(at))
        proxy.requests.clear()
        proxy.get_headers.clear()
        assert len(list(StreamingDataset(index, storage_options=store.options(at)))) == 350
    versions = {s.url.rsplit("/", 1)[-1]: s.version for s in index.shards}
    assert all(versions.values())
    assert not [path for method, path, _ in proxy.requests if method == "HEAD"]
    if store.kind == "gcs":
        reads = [path for _, path, _ in proxy.requests if path.startswith("/download/")]
        assert reads
        for path in reads:
            name = path.split("?")[0].rsplit("%2F", 1)[-1]
            assert f"ifGenerationMatch={versions[name]}" in path, path
    else:
        asked = [h.get("If-Match") for h in proxy.get_headers]
        assert asked and all(a and a.strip('"') in versions.values() for a in asked), asked


@pytest.mark.parametrize(
    ("fmt", "forgotten"), [("parquet", False), ("parquet", True), ("tar", False)]
)
def test_a_shard_rewritten_after_indexing_is_refused(
    store: Store, fmt: str, forgotten: bool
) -> None:
    """`forgotten`: the footers parsed in the first pass forgotten, as in a new process:
    the footer then goes out with the first chunks, and is refused the same way."""
    rel = upload(store, fmt, sizes=[200, 150])
    name = store.fs().ls(store.path(rel))[0].rsplit("/", 1)[-1]
    ds = StreamingDataset(store.url(rel), storage_options=store.options(), shuffle=False)
    assert len(list(ds)) == 350
    data = bytearray(store.fs().cat_file(store.path(f"{rel}/{name}")))
    data[len(data) // 3] ^= 0xFF  # the same size, other bytes: a new version
    store.rewrite(f"{rel}/{name}", bytes(data))
    if forgotten:
        FOOTERS.clear()
    with pytest.raises(StaleIndexError, match=rf"{rel}/{name}.*(changed|rebuild)"):
        list(ds)


@pytest.mark.parametrize("edit", ["drop", "short", "shifted"])
@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_a_range_other_than_the_one_asked_is_refused(store: Store, edit: str, fmt: str) -> None:
    rel = upload(store, fmt, sizes=[200, 150])
    store.open_to_anyone()  # Azure signs its range header: unsigned requests, to change it
    with proxied(store) as (proxy, at):
        options = store.options(at, credentials=store.kind != "azure")
        index = ShardIndex.build(store.url(rel, at), options)
        clean = list(StreamingDataset(index, storage_options=options, shuffle=False))
        proxy.faults = Faults(range_edit=edit)
        ds = StreamingDataset(index, storage_options=options, retry=QUICK, shuffle=False)
        try:
            rows = list(ds)
        except ShardError as e:
            error: ShardError | None = e
        else:
            error = None
    assert proxy.faulted, "no range was edited: the test tested nothing"
    assert error is not None, f"read {len(rows)} records of {len(clean)} and no error"
    assert re.search(rf"{rel}/part-0000\d", str(error)), str(error)
    assert "asked for bytes" in str(error) or "more than asked" in str(error), str(error)
    if edit == "drop":
        assert isinstance(error, RangeIgnoredError)


HINTS = {
    "s3": "AWS_ACCESS_KEY_ID",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
    "azure": "AZURE_STORAGE_CONNECTION_STRING",
    "http": "storage_options={'headers': {'Authorization'",
}


def test_missing_credentials_are_named_and_never_retried(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = upload(store, "parquet", sizes=[100])
    with proxied(store) as (proxy, at):
        if store.kind == "s3":  # botocore finds no keys
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
                monkeypatch.delenv(name)
            monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
            monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
            options = store.options(at)
        elif store.kind == "azure":  # a connection string without a key: anonymous
            options = store.options(at, credentials=False)
        else:  # a server refusing callers without credentials, as GCS does
            proxy.faults = Faults(unauthorized=401)
            options = store.options(at)
        error = read_in_thread(lambda: ShardIndex.build(store.url(rel, at), options))
    assert isinstance(error, PermissionError), repr(error)
    assert rel in str(error) and HINTS[store.kind] in str(error)
    # refused, not retried as transient (RetryPolicy's 8 tries); gcsfs's isdir and info
    # each ask up to 3 ways (the object, a listing, a prefix): 6 at most
    assert len(proxy.requests) + len(proxy.faulted) <= 6


def test_wrong_credentials_are_named_and_never_retried(
    store: Store, request: pytest.FixtureRequest
) -> None:
    rel = upload(store, "parquet", sizes=[100])
    # S3: moto with IAM checks on refuses the tests' fake keys (a real 403)
    endpoint = request.getfixturevalue("s3_auth_endpoint") if store.kind == "s3" else None
    with counting_proxy(endpoint or store.endpoint) as proxy:
        at = proxy.url
        options = store.options(at)
        if store.kind == "azure":  # a key the account does not have: a real 403 from Azurite
            options = {"connection_string": options["connection_string"].replace("Eby8", "Xby8")}
        elif store.kind != "s3":  # a server refusing the caller, as GCS does
            proxy.faults = Faults(unauthorized=403)
        error = read_in_thread(lambda: ShardIndex.build(store.url(rel, at), options))
    assert isinstance(error, PermissionError), repr(error)
    assert rel in str(error) and "access denied" in str(error) and HINTS[store.kind] in str(error)
    assert len(proxy.requests) + len(proxy.faulted) <= 6  # as above: never retried


@pytest.mark.parametrize("dead", ["503 on every GET", "connection refused"])
def test_a_dead_endpoint_is_a_named_error_with_default_settings(store: Store, dead: str) -> None:
    """The store's client as its defaults set it up (its own retries and timeouts) ends in
    a named error. On S3 our default RetryPolicy runs too (8 tries, ~10 s); elsewhere a
    3-try one: the policy is the same code on every store, and its 8 tries over the other
    clients' own retries took 7-17 s a case (~60 s of the suite)."""
    rel = upload(store, "parquet", sizes=[100, 100])
    retry = {} if store.kind == "s3" else {"retry": QUICK}

    def read() -> Any:
        return list(StreamingDataset(index, storage_options=options, **retry))

    with proxied(store) as (proxy, at):
        options = store.options(at)
        index = ShardIndex.build(store.url(rel, at), options)  # built while it was healthy
        if dead.startswith("503"):
            proxy.faults = Faults(every_get=True)
            error = read_in_thread(read)
    if not dead.startswith("503"):  # the proxy is gone: nothing listens at its port
        error = read_in_thread(read)
    assert isinstance(error, ShardError), repr(error)
    message = str(error)
    assert f"{rel}/part-0000" in message and "last error" in message
    # the last cause, as the store's client gave it
    cause = "reduce your request rate" if dead.startswith("503") else "connect"
    assert cause in message.lower(), message


def test_an_epoch_survives_one_get_in_five_answering_503(store: Store) -> None:
    rel = upload(store, "parquet", sizes=[300, 410, 170])
    clean = StreamingDataset(store.url(rel), storage_options=store.options(), seed=1)
    expected = list(clean)
    SCANS.clear()  # the faulty store serves the index's reads too, as in a fresh process
    with proxied(store, Faults(slowdown=0.2, seed=11)) as (proxy, at):
        ds = StreamingDataset(store.url(rel, at), storage_options=store.options(at), seed=1)
        rows = list(ds)
    assert [_plain(r) for r in rows] == [_plain(r) for r in expected]
    assert proxy.injected["slowdown"] > 0


@pytest.mark.parametrize("sizes", [[300, 410], [300, 410, 170, 90]], ids=["2", "4"])
def test_the_node_cache_serves_later_epochs_and_still_refuses_a_rewrite(
    store: Store, tmp_path: Path, sizes: list[int]
) -> None:
    """Epoch 1 comes from the node's folder: no byte of a shard is fetched, only the
    checks of the shards against the store are made: a metadata request a shard, or, on
    an object store where it costs less (4 shards, not 2: loader.cache.remote), one
    listing of their folder. A rewritten shard is refused either way."""
    rel = upload(store, "parquet", sizes=sizes)
    with proxied(store) as (proxy, at):
        kw: dict[str, Any] = {"storage_options": store.options(at), "seed": 4}
        ds = StreamingDataset(store.url(rel, at), cache_dir=str(tmp_path / "cache"), **kw)
        first = [_plain(r) for r in ds]
        proxy.requests.clear()
        proxy.get_headers.clear()
        ds.set_epoch(1)
        second = [_plain(r) for r in ds]
        ranged = [h for h in proxy.get_headers if {"range", "x-ms-range"} & {k.lower() for k in h}]
        assert ranged == [], ranged  # every shard's bytes from the cache
        listed = store.kind != "http" and len(sizes) == 4
        # a listing is one request (two on Azure: adlfs asks for the prefix first); a
        # metadata request a shard is at least one each (gcsfs sometimes asks twice)
        assert (len(proxy.requests) < len(sizes)) == listed, proxy.requests
        assert second != first and sorted(second, key=record_id) == sorted(first, key=record_id)
        assert sorted(map(record_id, second)) == list(range(sum(sizes)))
        name = store.fs().ls(store.path(rel))[0].rsplit("/", 1)[-1]
        blob = bytearray(store.fs().cat_file(store.path(f"{rel}/{name}")))
        blob[len(blob) // 3] ^= 0xFF
        store.rewrite(f"{rel}/{name}", bytes(blob))
        ds.set_epoch(2)
        with pytest.raises(StaleIndexError, match=rf"{rel}/{name}"):
            list(ds)


def test_the_planner_indexes_the_store(store: Store, tmp_path: Path) -> None:
    import json

    from shardstream.plan.cli import main

    rel = upload(store, "tar", sizes=[30, 0, 41, 17])
    saved = tmp_path / "plan.index.arrow"
    options = json.dumps(store.options())
    argv = [store.url(rel), "--world-size", "2", "--storage-options", options]
    assert main([*argv, "--save-index", str(saved)]) == 0
    rows = list(StreamingDataset(str(saved), storage_options=store.options(), shuffle=False))
    assert [record_id(r) for r in rows] == list(range(88))


@pytest.mark.parametrize("store", ["http"], indirect=True)
def test_http_credentials_go_where_the_error_says(store: Store) -> None:
    """The hint of a refused HTTP read (request headers in storage_options) works."""
    rel = upload(store, "parquet", sizes=[100, 50])
    with proxied(store, Faults(unauthorized=401)) as (proxy, at):
        with pytest.raises(PermissionError, match=re.escape("'headers': {'Authorization'")):
            StreamingDataset(store.url(rel, at))
        proxy.get_headers.clear()
        options = {"headers": {"Authorization": "Bearer token"}}
        rows = list(StreamingDataset(store.url(rel, at), storage_options=options, shuffle=False))
    assert [record_id(r) for r in rows] == list(range(150))
    assert proxy.get_headers
    assert all(h.get("Authorization") == "Bearer token" for h in proxy.get_headers)


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"], indirect=True)
@pytest.mark.parametrize("saved", [False, True])
def test_the_round_trips_before_the_first_batch_are_the_same_on_every_store(
    store: Store, saved: bool
) -> None:
    """A folder without a saved index: the look for one with the prefix's listing sent
    beside it (`list_ahead`), the footers, the first row groups: 3 in line on each store
    (GCS and Azure listed after the look, Azure after a HEAD too: 4 and 5). From a saved
    index: its GET, then the first row groups with their footers: 2 (the footers this
    process parsed while building the index forgotten, as a new job holds none). GCS's
    emulator names no generation in its answers, so a metadata GET follows each read
    (loader.storage.gcs; real GCS answers with it): those are left out of its count.
    The least of up to 3 starts (tests.s3proxy.least_in_line: load only lengthens a
    chain)."""
    rel = upload(store, "parquet")
    if saved:
        index = ShardIndex.build(store.url(rel), store.options())
        save_beside(index, f"{store.url(rel)}/{INDEX_NAME}", store.options())

    def start() -> tuple[StreamingDataset, CountingProxy, float, float]:
        FOOTERS.clear()  # as in a new job, which holds none
        SCANS.clear()
        with counting_proxy(store.endpoint, shaping=IN_LINE) as proxy:
            t0 = time.monotonic()
            options = store.options(proxy.url)
            ds = StreamingDataset(store.url(rel), storage_options=options, batch_size=64)
            assert len(next(iter(ds))["id"]) == 64
            return ds, proxy, t0, time.monotonic()

    def count(got: tuple[StreamingDataset, CountingProxy, float, float]) -> int:
        _, proxy, t0, t1 = got
        timeline = proxy.timeline
        emulated = [p.startswith("/storage/v1/b/") and "/o/" in p for _, p, *_ in timeline]
        return in_line(
            [(a, b) for (*_, a, b), e in zip(timeline, emulated) if t0 <= a <= t1 and not e]
        )

    want = 2 if saved else 3
    ds, proxy, t0, t1 = least_in_line(start, count, want)
    if store.kind != "gcs":
        assert ds.stats()["first_in_line"] == want == proxy.in_line(t0, t1)
