"""StreamingDataset over weighted Streams: the mixture invariants M1-M6 as records read
from files, workers, resume, elastic resume, S3 beside local, and bad mixtures."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardstream.loader import Stream, StreamingDataset
from shardstream.sampler import MixtureSampler

from .helpers import check_resume, take

# stream -> shard sizes (a 0-record shard in "b"); ids are unique across streams
SOURCES = {"a": [40, 25, 35], "b": [12, 0, 18], "c": [7]}
BASE = {"a": 0, "b": 10_000, "c": 20_000}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("mix")
    for name, sizes in SOURCES.items():
        (top / name).mkdir()
        first = BASE[name]
        for k, n in enumerate(sizes):
            ids = np.arange(first, first + n, dtype=np.int64)
            table = pa.table(
                {"id": ids, "tok": [[int(i), int(i) + 1] for i in ids], "src": [name] * n}
            )
            pq.write_table(table, top / name / f"p{k}.parquet", row_group_size=5)
            first += n
    return top


def streams(root: Path, weights: dict[str, float] | None = None) -> list[Stream]:
    weights = weights or {"a": 5.0, "b": 3.0, "c": 2.0}
    return [Stream(str(root / n), weight=w, name=n) for n, w in weights.items()]


def mix(root: Path, **kw: Any) -> StreamingDataset:
    kw.setdefault("epoch_size", 60)
    ws = kw.pop("weights", None)
    return StreamingDataset(streams(root, ws), **kw)


def ids_of(items: list[Any]) -> list[int]:
    if items and isinstance(items[0], dict) and isinstance(items[0]["id"], torch.Tensor):
        return [i for b in items for i in b["id"].tolist()]
    return [int(r["id"]) for r in items]


def stream_of(record_id: int) -> str:
    return max((b, n) for n, b in BASE.items() if record_id >= b)[1]


def epoch_ids(root: Path, rank: int, epoch: int, workers: int = 0, **kw: Any) -> list[int]:
    ds = mix(root, rank=rank, **kw)
    ds.set_epoch(epoch)
    return ids_of(list(DataLoader(ds, batch_size=None, num_workers=workers)))


# ------------------------------------------------------------------ M1 -----------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 8])
def test_m1_every_rank_yields_l_with_c_k_per_stream(
    root: Path, workers: int, batch_size: int | None
) -> None:
    kw = {"num_replicas": 3, "batch_size": batch_size, "drop_last": True}
    counts = MixtureSampler(
        [SOURCES[n] for n in "abc"], [5, 3, 2], 60, 3, 0, names=list("abc"), drop_last=True
    ).counts
    assert sum(counts) == 20
    for rank in range(3):
        ds = mix(root, rank=rank, **kw)
        for epoch in range(3):
            ds.set_epoch(epoch)
            items = list(DataLoader(ds, batch_size=None, num_workers=workers))
            got = ids_of(items)
            assert len(got) == 20
            per = Counter(stream_of(i) for i in got)
            assert [per[n] for n in "abc"] == list(counts)
            if batch_size:
                assert len(items) == len(ds) == math.ceil(20 / batch_size)
                names = [n for b in items for n in b["src"]]
                index = [int(k) for b in items for k in b["__stream__"]]
                assert [list("abc")[k] for k in index] == names  # __stream__ is the index
            else:
                assert len(ds) == 20
                assert all(r["__stream__"] == r["src"] for r in items)


# ------------------------------------------------------------------ M2 -----------------
def test_m2_each_pass_once_across_ranks_and_epochs(root: Path) -> None:
    """Stream c (7 records) is upsampled by whole fresh passes; a (100) runs across
    epochs: within each pass every record once, across ranks."""
    R, E, epochs = 2, 60, 6
    sampler = MixtureSampler(
        [SOURCES[n] for n in "abc"], [5, 3, 2], E, R, 0, names=list("abc"), drop_last=True
    )
    per_rank = {r: [epoch_ids(root, r, e, num_replicas=R, drop_last=True) for e in range(epochs)]
                for r in range(R)}  # fmt: skip
    for k, name in enumerate("abc"):
        n = sum(SOURCES[name])
        span = n // R  # records of a pass per rank (drop_last)
        sequences = [
            [i for e in range(epochs) for i in per_rank[r][e] if stream_of(i) == name]
            for r in range(R)
        ]
        assert all(len(s) == epochs * sampler.counts[k] for s in sequences)
        passes = min(len(s) for s in sequences) // span
        assert passes >= 1
        for p in range(passes):
            seen = [i for s in sequences for i in s[p * span : (p + 1) * span]]
            assert len(seen) == len(set(seen)) == R * span, (name, p)


# ------------------------------------------------------------------ M3 -----------------
def test_m3_every_batch_holds_the_mix(root: Path) -> None:
    ds = mix(root, num_replicas=1, rank=0, epoch_size=200, batch_size=10)
    counts = ds.sampler.counts  # type: ignore[attr-defined]
    L = sum(counts)
    for batch in ds:
        got = Counter(batch["__stream__"].tolist())
        for k, c in enumerate(counts):
            assert abs(got[k] - len(batch["id"]) * c / L) < 2


# ------------------------------------------------------------------ M4 -----------------
def test_m4_deterministic_reshuffled_and_keyed_by_name(root: Path) -> None:
    one = epoch_ids(root, 0, 0, num_replicas=2)
    assert one == epoch_ids(root, 0, 0, num_replicas=2)
    assert one != epoch_ids(root, 0, 1, num_replicas=2)
    reordered = StreamingDataset(
        list(reversed(streams(root))), epoch_size=60, num_replicas=2, rank=0
    )
    theirs = ids_of(list(reordered))
    for name in "abc":  # each stream reads the same records in the same order
        assert [i for i in one if stream_of(i) == name] == [
            i for i in theirs if stream_of(i) == name
        ]


# ------------------------------------------------------------------ M5 -----------------
@pytest.mark.parametrize("batch_size", [None, 6])
def test_m5_resume_in_the_same_layout(root: Path, batch_size: int | None) -> None:
    key = (lambda b: tuple(b["id"].tolist())) if batch_size else (lambda r: r["id"])
    check_resume(
        lambda: mix(root, num_replicas=2, rank=1, batch_size=batch_size),
        positions=[1, 3, 7, 19],
        epoch=2,
        key=key,
    )


def test_m5_resume_with_workers_reads_exactly_the_rest(root: Path) -> None:
    full = epoch_ids(root, 1, 1, workers=2, num_replicas=2, batch_size=4)
    ds = mix(root, num_replicas=2, rank=1, batch_size=4)
    ds.set_epoch(1)
    head = take(DataLoader(ds, batch_size=None, num_workers=2), 3)
    state = ds.consumed_state(3, 2)
    again = mix(root, num_replicas=2, rank=1, batch_size=4)
    again.load_state_dict(state)
    rest = list(DataLoader(again, batch_size=None, num_workers=2))
    assert ids_of(head) + ids_of(rest) == full


@pytest.mark.parametrize(("old", "new"), [((3, 0), (2, 2)), ((2, 2), (3, 1)), ((2, 0), (2, 2))])
def test_m5_elastic_resume_keeps_each_pass_once(
    root: Path, old: tuple[int, int], new: tuple[int, int]
) -> None:
    (R, W), (R2, W2) = old, new
    kw = {"drop_last": True, "batch_size": 2, "epoch_size": 90}
    consumed = 4  # batches every old rank delivered
    head: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(R):
        ds = mix(root, num_replicas=R, rank=rank, **kw)
        head += ids_of(take(DataLoader(ds, batch_size=None, num_workers=W), consumed))
        state = ds.consumed_state(consumed, W)
    rest: list[int] = []
    nxt: list[int] = []
    for rank in range(R2):
        ds = mix(root, num_replicas=R2, rank=rank, **kw)
        ds.load_state_dict(state)
        rest += ids_of(list(DataLoader(ds, batch_size=None, num_workers=W2)))
        ds.set_epoch(1)
        nxt += ids_of(list(DataLoader(ds, batch_size=None, num_workers=W2)))
    epoch0 = head + rest
    whole = Counter(i for r in range(R) for i in epoch_ids(root, r, 0, num_replicas=R, **kw))
    missing = whole - Counter(epoch0)
    assert not Counter(epoch0) - whole  # nothing read that the epoch does not hold
    assert sum(missing.values()) < R2  # only the last (< R2) records of the rest dropped
    # stream a (100 records) has not finished its first pass after two epochs: no repeats
    a = [i for i in epoch0 + nxt if stream_of(i) == "a"]
    assert len(a) == len(set(a))
    assert len(nxt) == R2 * (90 // R2)


# ------------------------------------------------------------------ M6 -----------------
@pytest.mark.parametrize("rank", [0, 1])
def test_m6_one_stream_reads_what_the_single_source_reads(root: Path, rank: int) -> None:
    n = sum(SOURCES["a"])
    kw = {"num_replicas": 2, "rank": rank, "shuffle": False, "drop_last": True}
    one = StreamingDataset([Stream(str(root / "a"), weight=1.0)], epoch_size=n, **kw)
    single = StreamingDataset(str(root / "a"), **kw)
    for epoch in range(2):
        one.set_epoch(epoch)
        single.set_epoch(epoch)
        assert ids_of(list(one)) == ids_of(list(single))


# ------------------------------------------------------------------ S3 -----------------
def test_an_s3_stream_beside_a_local_one(root: Path, s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("mixed")
    for p in sorted((root / "b").iterdir()):
        fs.put_file(str(p), f"mixed/b/{p.name}")
    local = Stream(str(root / "a"), weight=2.0, name="a")
    remote = Stream("s3://mixed/b/", weight=1.0, name="b", storage_options=s3.storage_options)
    ds = StreamingDataset([local, remote], epoch_size=30, batch_size=5)
    got = ids_of(list(ds))
    assert Counter(stream_of(i) for i in got) == {"a": 20, "b": 10}


# ------------------------------------------------------------------ errors -------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda r: [Stream(str(r / "a"), weight=0)], r"weight of stream .* must be finite and > 0"),
        (lambda r: [Stream(str(r / "a"), weight=-1.0)], r"must be finite and > 0, got -1.0"),
        (lambda r: [Stream(str(r / "a"), weight=math.nan)], r"must be finite and > 0, got nan"),
        (lambda r: [Stream(str(r / "a"), weight=math.inf)], r"must be finite and > 0, got inf"),
        (
            lambda r: [Stream(str(r / "a"), name="x"), Stream(str(r / "b"), name="x")],
            r"names must be unique; repeated: \['x'\]",
        ),
        (lambda r: [], "the source list is empty: give shard URLs, or loader.Stream"),
    ],
)
def test_bad_mixtures_are_named(root: Path, make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamingDataset(make(root), epoch_size=10) if make(root) else StreamingDataset(make(root))


def test_bad_epoch_sizes_and_small_streams_are_named(root: Path) -> None:
    with pytest.raises(ValueError, match=r"epoch_size // num_replicas = 3 // 4 = 0"):
        mix(root, epoch_size=3, num_replicas=4, rank=0)
    with pytest.raises(ValueError, match=r"stream 'c' has 7 records, fewer than num_replicas=8"):
        mix(root, num_replicas=8, rank=0, drop_last=True)
    padded = mix(root, num_replicas=8, rank=7, epoch_size=80)  # without drop_last: padded
    assert len(ids_of(list(padded))) == 10


def test_batches_need_one_format_and_one_kind(root: Path, tmp_path: Path) -> None:
    import webdataset as wds

    (tmp_path / "t").mkdir()
    with wds.TarWriter(str(tmp_path / "t" / "x.tar")) as w:
        w.write({"__key__": "k", "id": "1"})
    two = [Stream(str(root / "a")), Stream(str(tmp_path / "t"))]
    with pytest.raises(ValueError, match=r"different formats .*record mode"):
        StreamingDataset(two, batch_size=4)
    assert len(list(StreamingDataset(two, epoch_size=4))) == 4  # records mix formats
    (tmp_path / "f").mkdir()
    pq.write_table(
        pa.table({"id": [1.5, 2.5], "tok": [[1, 2], [3, 4]]}), tmp_path / "f" / "x.parquet"
    )
    other = [Stream(str(root / "a")), Stream(str(tmp_path / "f"))]
    with pytest.raises(
        ValueError,
        match=r"column 'id' is a int64 tensor \(n,\) in stream .* but "
        r"a double tensor",
    ):
        StreamingDataset(other, batch_size=4, columns=["id", "tok"])
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the shards"):
        StreamingDataset(other, batch_size=4, columns=["nope"])


# ------------------------------------------------------------------ properties ---------
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.tuples(*[st.integers(1, 9)] * 3),
    epoch_size=st.integers(6, 120),
    replicas=st.integers(1, 3),
    workers=st.sampled_from([0, 2]),
    batch=st.sampled_from([None, 3, 8]),
    stop=st.integers(0, 40),
)
def test_properties_resume_anywhere_reads_the_rest(
    root: Path,
    weights: tuple[int, int, int],
    epoch_size: int,
    replicas: int,
    workers: int,
    batch: int | None,
    stop: int,
) -> None:
    ws = dict(zip("abc", map(float, weights)))
    rank = replicas - 1
    kw = {"num_replicas": replicas, "rank": rank, "epoch_size": epoch_size, "batch_size": batch}
    ds = mix(root, weights=ws, **kw)
    ds.set_epoch(1)
    full = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(ids_of(full)) == epoch_size // replicas
    k = min(stop, len(full))
    state = ds.consumed_state(k, workers)
    again = mix(root, weights=ws, **kw)
    again.load_state_dict(state)
    rest = list(DataLoader(again, batch_size=None, num_workers=workers))
    assert ids_of(full[:k]) + ids_of(rest) == ids_of(full)


def test_streams_are_read_concurrently(root: Path) -> None:
    """Every stream's first part is read before the first item is handed out (they start
    together), so a slow stream's block does not queue behind another's."""
    ds = mix(root, num_replicas=1, rank=0, batch_size=4)
    first = next(iter(ds))
    assert set(first["__stream__"].tolist()) == {0, 1, 2}
    assert list(itertools.islice(ds, 2))  # and iteration goes on from a fresh start


def test_streams_share_one_decoding_pool(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The streams' groups are decoded by one pool of decode_threads() threads (and the
    consumer, which decodes a group itself when it would only wait for it; local streams
    start one after the other): a pool per stream would run 3 x decode_threads() decoding
    threads, more than the cores."""
    import threading

    from shardstream.loader.read import plan_reader as pipeline

    threads: set[int] = set()
    decode = pipeline.PlanReader.decode

    def counted(self: Any, fs: Any, entry: Any, raw: Any, *read_ahead: Any) -> Any:
        threads.add(threading.get_ident())
        return decode(self, fs, entry, raw, *read_ahead)

    monkeypatch.setattr(pipeline.PlanReader, "decode", counted)
    ds = mix(root, batch_size=4, epoch_size=120)
    got = ids_of(list(ds))
    assert len(got) == 120
    assert threads and len(threads) <= pipeline.decode_threads() + 1


def test_a_list_of_streams_makes_a_mixture_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """`loader` imports its parts when first used: StreamingDataset([Stream, ...]) must
    import the mixture itself when nothing else has (as a training script that imports
    only these two names does)."""
    import subprocess
    import sys

    for k in range(2):
        pq.write_table(pa.table({"id": np.arange(k * 10, k * 10 + 10)}), tmp_path / f"{k}.parquet")
    code = (
        "import sys; from shardstream.loader import Stream, StreamingDataset; "
        f"ds = StreamingDataset([Stream({str(tmp_path / '0.parquet')!r}), "
        f"Stream({str(tmp_path / '1.parquet')!r})], shuffle=False); "
        "print(type(ds).__name__, sorted(int(r['id']) for r in ds))"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr
    name, ids = proc.stdout.split(" ", 1)
    assert name == "MixtureDataset" and ids.strip() == str(list(range(20)))


def test_local_streams_share_one_reading_thread(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local Parquet streams' groups are read ahead by one thread for them all
    (readahead.reading_pool), not one a stream contending for the core the consumer
    leaves; each record is still its file's row, every column."""
    import threading

    from shardstream.loader.formats.parquet.format import ParquetFormat
    from shardstream.loader.read import readahead

    readers: set[int] = set()
    real = ParquetFormat.read_local

    def spy(self: ParquetFormat, fs: Any, got: Any) -> pa.Table:
        if threading.current_thread().name.startswith("shardstream-read"):
            readers.add(threading.get_ident())
        return real(self, fs, got)

    monkeypatch.setattr(ParquetFormat, "read_local", spy)
    monkeypatch.setattr(
        "shardstream.loader.formats.parquet.meta.GROUP_BYTES", 1
    )  # a row group a group
    want = {
        r["id"]: r for p in sorted(root.glob("*/*.parquet")) for r in pq.read_table(p).to_pylist()
    }
    got = list(mix(root, epoch_size=120))
    assert len(got) == 120 and len(readers) == readahead.THREADS
    for r in got:
        assert {k: v for k, v in r.items() if k != "__stream__"} == want[r["id"]]
        assert r["__stream__"] == r["src"]


def test_a_batchs_gather_takes_each_decoded_group_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixture's streams hand their rows as Selections, each holding copies of its groups'
    blocks; the batch's one gather takes a group's block once however many Selections hold
    it (a group at the edge of two slabs is in both: a part a copy made more, smaller
    copies); each row is still its file's row."""
    from shardstream.loader.formats.parquet.format import ParquetFormat

    for s, (name, count) in enumerate((("x", 4), ("y", 3))):  # uneven: a batch's rows of a
        (tmp_path / name).mkdir()  # stream cross its parts' ends (a Reading.gather each)
        for k in range(count):
            ids = np.arange(s * 10_000 + k * 600, s * 10_000 + (k + 1) * 600, dtype=np.int64)
            table = pa.table({"id": ids, "tok": [[int(i), int(i) + 1] for i in ids]})
            pq.write_table(table, tmp_path / name / f"p{k}.parquet", row_group_size=50)
    parts: list[tuple[int, int]] = []  # (blocks given, distinct groups among them)
    real = ParquetFormat.gather

    def spy(self: ParquetFormat, joined: Any, which: Any, rows: Any) -> dict[str, Any]:
        parts.append((len(joined), len({id(b.column("id")) for b in joined})))
        return real(self, joined, which, rows)

    monkeypatch.setattr(ParquetFormat, "gather", spy)
    monkeypatch.setattr(
        "shardstream.loader.formats.parquet.meta.GROUP_BYTES", 1
    )  # a row group a group
    want = {
        r["id"]: r
        for p in sorted(tmp_path.glob("*/*.parquet"))
        for r in pq.read_table(p).to_pylist()
    }
    ds = StreamingDataset([Stream(str(tmp_path / n)) for n in ("x", "y")], batch_size=64)
    batches = list(ds)
    assert parts and all(given == distinct for given, distinct in parts), parts
    got = [i for b in batches for i in b["id"].tolist()]
    assert sorted(got) == sorted(want)  # natural weights, one pass: each record once
    for b in batches:
        for i, record_id in enumerate(b["id"].tolist()):
            assert b["tok"][i].tolist() == want[record_id]["tok"]
