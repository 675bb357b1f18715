"""Local Parquet groups read by pyarrow on a reading thread (loader.read.readahead): the records are
the files' own, whole; an error names the shard it came from, not one read before it."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardError, ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.formats.parquet.format import ParquetFormat


def _table(first: int, n: int, text: pa.DataType | None = None) -> pa.Table:
    text = text or pa.string()
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "text": pa.array([f"r{i}-" + "x" * (i % 13) for i in ids.tolist()], text),
            "vec": pa.array([[i, i + 1, i + 2] for i in ids.tolist()], pa.list_(pa.int32())),
        }
    )


def _shards(root: Path, count: int, rows: int, row_group_size: int) -> None:
    """`count` shards of `rows` records (ids follow on), row groups of `row_group_size`."""
    for s in range(count):
        path = root / f"part-{s:05d}.parquet"
        pq.write_table(_table(s * rows, rows), path, row_group_size=row_group_size)


def _expected(paths: list[Path]) -> dict[int, dict[str, Any]]:
    """Every record of the files as pyarrow reads them, by id."""
    rows = [r for p in paths for r in pq.read_table(p).to_pylist()]
    return {r["id"]: r for r in rows}


def _records(ds: StreamingDataset) -> list[dict[str, Any]]:
    out = []
    for r in ds:
        out.append({k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()})
    return out


def test_files_of_other_string_types_and_row_groups_read_whole(tmp_path: Path) -> None:
    # string and large_string files alternate (pandas 3 and polars write the latter): the
    # reading thread reads each as it is, the format casts each to the dataset's schema
    paths = []
    for s in range(6):
        text = pa.large_string() if s % 2 else pa.string()
        path = tmp_path / f"part-{s:05d}.parquet"
        pq.write_table(_table(s * 100, 100, text), path, row_group_size=[17, 30, 50][s % 3])
        paths.append(path)
    want = _expected(paths)
    for shuffle in (False, True):
        got = _records(StreamingDataset(str(tmp_path), shuffle=shuffle, seed=3))
        assert sorted(r["id"] for r in got) == sorted(want)
        assert all(r == want[r["id"]] for r in got)  # every column of the record, whole
    first = _records(StreamingDataset(str(tmp_path), shuffle=False))
    assert [r["id"] for r in first] == list(range(600))  # storage order unshuffled


def test_empty_row_groups_between_full_ones(tmp_path: Path) -> None:
    path = tmp_path / "part-00000.parquet"
    with pq.ParquetWriter(path, _table(0, 1).schema) as w:
        w.write_table(_table(0, 40))
        w.write_table(_table(40, 0))
        w.write_table(_table(40, 40))
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [40, 0, 40]
    want = _expected([path])
    got = _records(StreamingDataset(str(tmp_path), shuffle=True, seed=1))
    assert len(got) == 80 and all(r == want[r["id"]] for r in got)
    batches = list(StreamingDataset(str(tmp_path), shuffle=False, batch_size=16))
    assert [int(i) for b in batches for i in b["id"]] == list(range(80))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_damaged_group_is_named_by_its_own_shard(
    tmp_path: Path, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # groups are read ahead: the error of the last shard's group must not be put on
    # the group the consumer waits for, nor come before the records read ahead of it;
    # and the failed read is not made again to name it (a doomed read can take seconds)
    reads: list[tuple[str, list[int]]] = []
    real = ParquetFormat.read_local

    def spy(self: ParquetFormat, fs: Any, got: Any) -> pa.Table:
        reads.append((Path(got.shard.url).name, list(got.groups)))
        return real(self, fs, got)

    monkeypatch.setattr(ParquetFormat, "read_local", spy)
    for s in range(4):
        pq.write_table(_table(s * 64, 64), tmp_path / f"part-{s:05d}.parquet", row_group_size=16)
    d = ShardIndex.build(str(tmp_path)).shards[3].details
    path = tmp_path / "part-00003.parquet"
    raw = bytearray(path.read_bytes())
    start, n = d["row_group_offsets"][3], d["row_group_bytes"][3]
    raw[start : start + n] = b"\x17" * n  # garbage pages, same size: the footer parses
    path.write_bytes(bytes(raw))
    ds = StreamingDataset(str(tmp_path), shuffle=shuffle, seed=2)
    got = []
    named = r"part-00003.parquet: cannot read row groups \[[0-9, ]*3\]"
    with pytest.raises(ShardError, match=named):
        for r in ds:
            got.append(int(r["id"]))
    if not shuffle:  # the shards before came whole first (small row groups read as one)
        assert got == list(range(len(got))) and len(got) >= 3 * 64
    damaged = [groups for name, groups in reads if name == path.name and 3 in groups]
    assert len(damaged) == 1, reads


def test_stopping_midway_then_reading_again(tmp_path: Path) -> None:
    for s in range(5):
        pq.write_table(_table(s * 200, 200), tmp_path / f"part-{s:05d}.parquet", row_group_size=25)
    want = _expected(sorted(tmp_path.glob("*.parquet")))
    ds = StreamingDataset(
        str(tmp_path), shuffle=True, seed=5, batch_size=32, memory_budget=64 << 10
    )
    head = list(itertools.islice(iter(ds), 3))  # the reading closes with groups in flight
    assert len(head) == 3
    ids = [int(i) for b in ds for i in b["id"]]
    assert sorted(ids) == sorted(want)
    for b in StreamingDataset(str(tmp_path), shuffle=True, seed=5, batch_size=32):
        for k, i in enumerate(b["id"].tolist()):
            assert b["text"][k] == want[i]["text"]
            assert b["vec"][k].tolist() == want[i]["vec"]


def test_groups_are_read_on_the_reading_thread_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shards(tmp_path, 4, 4000, 1000)
    read_on: list[str] = []
    real = ParquetFormat.read_local

    def spy(self: ParquetFormat, fs: Any, got: Any) -> pa.Table:
        read_on.append(threading.current_thread().name)
        return real(self, fs, got)

    monkeypatch.setattr(ParquetFormat, "read_local", spy)
    want = _expected(sorted(tmp_path.glob("*.parquet")))
    got = _records(StreamingDataset(str(tmp_path), shuffle=True, seed=4))
    assert sorted(r["id"] for r in got) == sorted(want) and all(r == want[r["id"]] for r in got)
    # (the consumer reads a group itself when the thread has not started it yet)
    assert len(read_on) >= 4 and any(name.startswith("shardstream-read") for name in read_on)


def _ids_file(path: Path, first: int, n: int) -> None:
    """Ids first..first+n as plain int64, uncompressed, no statistics: the same size for any
    first of the same digits' width."""
    table = pa.table({"id": np.arange(first, first + n)})
    pq.write_table(table, path, row_group_size=500, compression="none", write_statistics=False)


def test_files_rewritten_the_same_size_yield_none_of_their_new_records(tmp_path: Path) -> None:
    # groups read on the reading thread are checked there (the file's size and version)
    # before they are handed on: a file replaced by one of the same size and layout, whose
    # pages pyarrow reads without complaint, is a StaleIndexError, not other records
    paths = [tmp_path / f"part-{s:05d}.parquet" for s in range(4)]
    for s, path in enumerate(paths):
        _ids_file(path, s * 4000, 4000)
    ds = StreamingDataset(str(tmp_path), shuffle=True, seed=2, batch_size=100)
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    for s, path in enumerate(paths):
        size = path.stat().st_size
        _ids_file(path, s * 4000 + 10**6, 4000)
        assert path.stat().st_size == size
    seen: list[int] = []
    with pytest.raises(StaleIndexError, match=r"part-0000\d\.parquet .*rebuild it"):
        for batch in ds:
            seen.extend(batch["id"].tolist())
    assert all(i < 10**6 for i in seen)


_FRESH = """
import sys
import pyarrow.parquet as pq
from shardstream.loader import StreamingDataset
root = sys.argv[1]
batches = list(StreamingDataset(root, shuffle=True, seed=1, batch_size=7))
records = list(StreamingDataset(root, shuffle=False))
print(sorted(m for m in ("pandas", "pyarrow.dataset") if m in sys.modules))
want = {r["id"]: r for r in pq.read_table(root).to_pylist()}  # (imports both)
got = [{k: b[k][i] for k in ("id", "text")} for b in batches for i in range(len(b["id"]))]
assert sorted(int(r["id"]) for r in got) == sorted(want)
assert all(r["text"] == want[int(r["id"])]["text"] for r in got)
assert [r["id"] for r in records] == sorted(want)
assert all(r == want[r["id"]] for r in records)
"""


def test_a_fresh_process_reads_local_parquet_without_pandas(tmp_path: Path) -> None:
    # pyarrow imports pandas (0.17 s, ~40 MB a process) from `pa.array`, `pa.scalar` and
    # `import pyarrow.dataset`: indexing and reading local Parquet use none of them
    import pandas  # noqa: F401  (installed: the test extra has it, so the check means something)

    for s in range(3):
        pq.write_table(_table(s * 50, 50), tmp_path / f"part-{s:05d}.parquet", row_group_size=8)
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines() == ["[]"]


_LEFT = """
import sys
import pyarrow.parquet as pq
from shardstream.loader import StreamingDataset
want = {r["id"]: r for r in pq.read_table(sys.argv[1]).to_pylist()}
it = iter(StreamingDataset(sys.argv[1], seed=1, batch_size=None if sys.argv[2] == "-" else 5))
first = next(it)
if sys.argv[2] == "-":
    assert first == want[first["id"]]
print("read")
"""


@pytest.mark.parametrize("batch", ["-", "5"])
def test_a_process_leaving_a_reading_midway_exits_quietly(tmp_path: Path, batch: str) -> None:
    # the reading is closed as its generator is collected at exit, when module globals are
    # None: it once printed "Exception ignored in ... 'NoneType' object has no attribute"
    for s in range(3):
        pq.write_table(_table(s * 50, 50), tmp_path / f"part-{s:05d}.parquet", row_group_size=8)
    out = subprocess.run(
        [sys.executable, "-c", _LEFT, str(tmp_path), batch],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["read"] and out.stderr == ""


def test_local_reads_decode_into_the_read_pool(tmp_path: Path) -> None:
    # ParquetFile takes no memory pool: its reader is swapped for one made with the pool
    # (a pyarrow whose reader no longer opens so would silently keep mimalloc's growth)
    from shardstream.loader.formats.parquet.local import pooled, read_pool

    path = tmp_path / "part-00000.parquet"
    pq.write_table(_table(0, 3000), path, row_group_size=1000)
    pool = read_pool()
    assert pool is not None and pool.backend_name == "jemalloc"  # Linux wheels have it
    pf = pooled(pq.ParquetFile(str(path)), str(path))
    before = pool.bytes_allocated()
    table = pf.read_row_groups([1], columns=["id", "vec"], use_threads=False)
    assert pool.bytes_allocated() - before >= table.nbytes // 2
    assert table.equals(pq.ParquetFile(str(path)).read_row_groups([1], columns=["id", "vec"]))


def test_a_local_reading_charges_only_the_groups_its_thread_reads_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 shards of 8 groups under a budget that holds them all: a reading starts (charges)
    # only what its thread reads ahead and a few queued, so a mixture's streams sharing one
    # budget each find room for the groups their consumer needs next
    from shardstream.loader.read import readahead
    from shardstream.loader.read.budget import MemoryBudget

    _shards(tmp_path, 24, 800, 100)
    charged: list[bool] = []
    real = MemoryBudget.charge

    def spy(self: MemoryBudget, n: int, force: bool = False) -> bool:
        charged.append(force)
        return real(self, n, force)

    monkeypatch.setattr(MemoryBudget, "charge", spy)
    monkeypatch.setattr(
        "shardstream.loader.formats.parquet.meta.GROUP_BYTES", 1
    )  # a row group a group
    ds = StreamingDataset(str(tmp_path), shuffle=True, seed=4, batch_size=64, memory_budget=1 << 30)
    it = iter(ds)
    first = next(it)
    window = 8  # pieces a block interleaves: one group of each is held
    assert len(charged) <= readahead.READAHEAD + readahead.QUEUED + 2 * window < 24 * 8
    rest = [first, *it]
    want = _expected(sorted(tmp_path.glob("*.parquet")))
    got = [
        {k: (v[i].tolist() if hasattr(v, "tolist") else v[i]) for k, v in b.items()}
        for b in rest
        for i in range(len(b["id"]))
    ]
    assert sorted(r["id"] for r in got) == sorted(want) and all(r == want[r["id"]] for r in got)
    assert len(charged) == 24 * 8  # every group, once


def test_a_local_mixture_starts_every_streams_first_groups_before_reading_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three local streams share one reading thread, which reads groups in the order they
    # are handed to it: each stream's first groups go to it before the first stream's
    # read-ahead, so the thread reads the later streams' first groups beside the consumer
    # (before, the first stream handed it 20 groups, and the consumer read the others' alone)
    from shardstream.loader import Stream
    from shardstream.loader.read.readahead import ReadAhead

    for name, count in (("a", 10), ("b", 5), ("c", 1)):
        (tmp_path / name).mkdir()
        for s in range(count):
            first = {"a": 0, "b": 10, "c": 15}[name] * 800 + s * 800
            pq.write_table(_table(first, 800), tmp_path / name / f"{s}.parquet", row_group_size=100)
    monkeypatch.setattr(
        "shardstream.loader.formats.parquet.meta.GROUP_BYTES", 1
    )  # a row group a group
    handed: list[str] = []
    real = ReadAhead.add

    def spy(self: ReadAhead, entries: list[Any]) -> None:
        handed.extend(Path(self.reader.index.shards[e.shard].url).parent.name for e in entries)
        real(self, entries)

    monkeypatch.setattr(ReadAhead, "add", spy)
    weights = {"a": 0.6, "b": 0.3, "c": 0.1}
    streams = [Stream(str(tmp_path / n), weight=w, name=n) for n, w in weights.items()]
    ds = StreamingDataset(streams, batch_size=64, seed=3)
    it = iter(ds)
    first = next(it)
    a_ahead = [k for k, name in enumerate(handed) if name == "a"][8]  # a's 9th: read-ahead
    assert handed.index("b") < a_ahead and handed.index("c") < a_ahead, handed[:30]
    # every record whole, from its stream's files
    want = {n: _expected(sorted((tmp_path / n).glob("*.parquet"))) for n in weights}
    names = list(weights)
    count = 0
    for b in [first, *it]:
        for i, k in enumerate(b["__stream__"].tolist()):
            row = want[names[k]][int(b["id"][i])]
            assert b["text"][i] == row["text"] and b["vec"][i].tolist() == row["vec"]
            count += 1
    assert count == 16 * 800 == len(ds) * 64  # epoch_size: all streams' records
