"""A mixture's first batch waits for the groups it needs, not for a step's worth of each
stream: each stream's first part is the first batch's most (PlanReader.parts(first=)), and
the chunking never changes what is read or in which order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardIndex, Stream, StreamingDataset
from shardstream.loader.formats.parquet import meta as parquet_meta
from shardstream.loader.read import reading
from shardstream.loader.read.plan_reader import PlanReader
from shardstream.sampler import ShardSampler

from .rowdata import rows_of

SHARDS, ROWS, GROUP = 8, 400, 40  # 10 row groups a shard


@pytest.fixture(autouse=True)
def one_row_group_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row group its own read group (these small files would otherwise be one each)."""
    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 1)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("first_batch")
    rng = np.random.default_rng(7)
    for s, name in enumerate(("a", "b")):
        (out / name).mkdir()
        for k in range(SHARDS):
            ids = np.arange(ROWS, dtype=np.int64) + (s * SHARDS + k) * ROWS
            table = pa.table(
                {
                    "id": ids,
                    "x": rng.standard_normal(ROWS),
                    "text": [f"{name}-{i}-" + "t" * int(i % 13) for i in ids.tolist()],
                }
            )
            pq.write_table(table, out / name / f"part-{k:02d}.parquet", row_group_size=GROUP)
    return out


def records(root: Path) -> dict[int, dict[str, Any]]:
    tables = [pq.read_table(p) for name in ("a", "b") for p in sorted((root / name).iterdir())]
    return {r["id"]: r for t in tables for r in t.to_pylist()}


def mixture(root: Path, **kw: Any) -> StreamingDataset:
    streams = [Stream(str(root / "a"), weight=0.6), Stream(str(root / "b"), weight=0.4)]
    return StreamingDataset(streams, seed=3, **kw)


def test_the_first_batch_waits_only_for_the_groups_the_openings_send(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 64 of 40-row groups, 8 pieces interleaved a block: the first batch takes a
    few records of each piece's first group, which each stream's opening starts (its first
    8 groups). A stream's first part of a whole step (2,048 positions, ~1,000 records a
    stream) waited for ~3 groups a piece: up to the 56th started, long after the opening."""
    waited: list[int] = []
    real = reading.Reading.wait

    def wait(self: reading.Reading, key: Any) -> Any:
        if key in self.groups:
            waited.append(self.groups[key].order)
        else:  # not started yet: it will be the next one
            waited.append(self.submitted + 1)
        return real(self, key)

    monkeypatch.setattr(reading.Reading, "wait", wait)
    ds = mixture(root, batch_size=64)
    batch = next(iter(ds))
    assert waited and max(waited) <= 8, sorted(waited)
    want = records(root)
    got = list(rows_of(batch, batch=True))
    assert len(got) == 64
    for row in got:
        assert {k: v for k, v in row.items() if k != "__stream__"} == want[row["id"]]


@pytest.mark.parametrize("batch", [64, 200, 2048, 5000])
def test_the_first_parts_change_no_record_and_no_order(root: Path, batch: int) -> None:
    """The epoch's records in batches of any size are the epoch in record mode, in the same
    order (record mode's parts start with no short first one), every column whole."""
    ds = mixture(root, batch_size=batch)
    flat = [row for b in ds for row in rows_of(b, batch=True)]
    plain = list(mixture(root))
    assert [r["id"] for r in flat] == [r["id"] for r in plain]
    want = records(root)
    assert len(flat) == len(want) == 2 * SHARDS * ROWS
    for row, rec in zip(flat, plain):
        assert ds.names[row["__stream__"]] == rec["__stream__"]
        assert {k: v for k, v in row.items() if k != "__stream__"} == want[row["id"]]


@pytest.mark.parametrize("first", [0, 1, 37, 64, 255, 256, 300])
def test_parts_with_a_short_first_part(root: Path, first: int) -> None:
    """parts(first=): a first part of `first` records (0 < first < step), then parts of
    `step` ending at multiples of it from there; the same records in the same order."""
    index = ShardIndex.build(str(root / "a"))
    ds = StreamingDataset(index, batch_size=256)
    plan = ShardSampler(index, 1, 0, seed=5, groups=ds.groups, window=8).plan()

    def parts(**kw: Any) -> list[list[int]]:
        reader = PlanReader(
            index, ds._format(), columns=None, storage_options={}, retry=ds.retry, read_threads=4
        )
        return [p["id"].tolist() for p in reader.parts([(plan, 0, len(plan))], 256, **kw)]

    plain, cut = parts(), parts(first=first)
    sizes = [len(p) for p in cut]
    lead = first if 0 < first < 256 else 256
    assert sizes[0] == lead and all(n == 256 for n in sizes[1:-1]), sizes
    assert sum(sizes) == SHARDS * ROWS
    assert [i for p in cut for i in p] == [i for p in plain for i in p]


def test_a_stream_of_fewer_shards_than_the_window_opens_with_one_group_a_shard(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stream's opening starts the first group of each piece of its first block, and
    nothing else: a stream of 3 shards (a block of 3 pieces under a window of 8) starts 3
    groups, not 8 (its pieces' second groups used to be queued on the shared reading thread
    before the next stream's first groups, and the first batch waited for them)."""
    opened: list[list[tuple[int, int]]] = []  # per stream, its opening's (shard, first row)
    real = reading.Reading._started

    def started(self: reading.Reading, groups: list[Any]) -> None:
        if not getattr(self, "_seen", False):
            self._seen = True  # type: ignore[attr-defined]
            opened.append([(g.shard, g.first) for g in groups])
        real(self, groups)

    waited: set[tuple[int, int]] = set()  # (shard, first row) of the groups waited for
    checked = reading.Reading._checked

    def spy(self: reading.Reading, entry: Any) -> Any:
        waited.add((entry.shard, entry.first))
        return checked(self, entry)

    monkeypatch.setattr(reading.Reading, "_started", started)
    monkeypatch.setattr(reading.Reading, "_checked", spy)
    a = [str(p) for p in sorted((root / "a").iterdir())[:3]]
    streams = [Stream(a, weight=0.5, name="a"), Stream(str(root / "b"), weight=0.5, name="b")]
    ds = StreamingDataset(streams, seed=3, batch_size=64)
    batch = next(iter(ds))
    assert [len(o) for o in opened] == [3, SHARDS], opened
    for o in opened:  # one group of each shard
        assert len({shard for shard, _ in o}) == len(o), o
    # the first batch waited only for opened groups: each piece's first in its keyed order
    assert waited and waited <= {g for o in opened for g in o}, (waited, opened)
    want = records(root)
    got = list(rows_of(batch, batch=True))
    assert len(got) == 64 and {r["__stream__"] for r in got} == {0, 1}
    for row in got:
        assert {k: v for k, v in row.items() if k != "__stream__"} == want[row["id"]]
