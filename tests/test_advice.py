"""sampler/advice.py: the layout arithmetic against the sampler's computed plans, and the
planner's advice against real files (written by pandas and pyarrow) planned by the real
planner (shardstream-plan's main)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.plan.cli import main
from shardstream.sampler.advice import (
    MIN_GROUP_BYTES,
    advise,
    fetched_rows,
    max_rows_per_group,
    mean_amplification,
    reader_records,
    records_needed,
    worst_amplification,
)
from shardstream.sampler.planning import all_plans

# --- the arithmetic --------------------------------------------------------------------


def test_the_largest_group_and_the_smallest_part_invert_the_bound() -> None:
    for part in range(1, 3000):
        g = max_rows_per_group(part)
        assert worst_amplification(g, part) <= 1.1 < worst_amplification(g + 1, part)
        assert records_needed(g) <= part < records_needed(g + 1)
    assert max_rows_per_group(4882) == 245  # 512 ranks x 8 workers over 20,000,000 records


def _plans(sizes: list[int], world: int, workers: int, **kw: Any) -> list[tuple[int, int, Any]]:
    return list(
        all_plans(
            np.asarray(sizes, dtype=np.int64),
            num_replicas=world,
            num_workers=workers,
            window=8,
            **{"seed": 0, "epoch": 0, "shuffle": True, "drop_last": False, **kw},
        )
    )


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=30),
    group=st.integers(1, 40),
    world=st.integers(1, 6),
    workers=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    node=st.booleans(),
)
def test_every_computed_plan_is_within_the_bound(
    sizes: list[int],
    group: int,
    world: int,
    workers: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    node: bool,
) -> None:
    """Shards in groups of `group` rows (each shard's last one short): every worker fetches
    at most its records + 2 (g - 1) rows (4 with locality="node"), the smallest part is
    reader_records, and the job at most its records + g a part."""
    n = sum(sizes)
    if n == 0 or (drop_last and n < world):
        return
    local = world if node else None
    plans = _plans(
        sizes,
        world,
        workers,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        drop_last=drop_last,
        local_world_size=local,
    )
    shard_rows = np.asarray(sizes, dtype=np.int64)
    cuts = 4 if node else 2
    total = 0
    for _, _, plan in plans:
        fetched = int(fetched_rows(plan.starts, plan.stops, group, shard_rows[plan.shards]).sum())
        assert fetched <= len(plan) + cuts * (group - 1)
        if len(plan):
            assert fetched / len(plan) <= worst_amplification(group, len(plan), cuts) + 1e-12
        total += fetched
    assert min(len(p) for _, _, p in plans) == reader_records(n, world, workers, drop_last)
    read = sum(len(p) for _, _, p in plans)
    assert total <= read + world * workers * cuts // 2 * group


def test_the_bound_is_reached() -> None:
    """Storage order, 5-row groups, parts of 12: the part [24, 36) starts 4 rows into a
    group and ends 1 row into one, fetching rows 20-40: 20 for 12, 1 + 2 * 4 / 12."""
    plans = _plans([60], world=5, workers=1, shuffle=False)
    amps = [int(fetched_rows(p.starts, p.stops, 5, 60).sum()) / len(p) for _, _, p in plans]
    assert max(amps) == pytest.approx(worst_amplification(5, 12)) == pytest.approx(20 / 12)


def test_the_job_fetches_about_the_mean() -> None:
    """Shards of random sizes: over seeds, the job's factor is about mean_amplification."""
    rng = np.random.default_rng(7)
    sizes = rng.integers(50, 800, 40).tolist()
    n, group, world, workers = sum(sizes), 25, 4, 3
    factors = []
    for seed in range(20):
        plans = _plans(sizes, world, workers, seed=seed)
        fetched = sum(
            int(fetched_rows(p.starts, p.stops, group, np.asarray(sizes)[p.shards]).sum())
            for _, _, p in plans
        )
        factors.append(fetched / sum(len(p) for _, _, p in plans))
    expected = mean_amplification(group, n, world, workers, False) - 1
    assert np.mean(factors) - 1 == pytest.approx(expected, rel=0.2)


def test_the_issues_job_gets_numbers_not_a_template() -> None:
    """2,000 shards of 10,000 rows (250-row groups, 100 MB) for 512 ranks x 8 workers: parts
    of 4,882 records take groups of at most 245 rows (250 is just over), and the 2,000
    shards, 100 MB each, stay. 2 ranks x 1 worker take 16 MB groups (1,600 rows)."""
    a = advise(
        20_000_000,
        512,
        8,
        stored_bytes=200e9,
        current_shards=2000,
        current_rows_per_group=250,
    )
    assert (a.records_per_reader, a.rows_per_group, a.num_shards) == (4882, 245, 2000)
    assert a.fits and a.current_fits is False and a.worst_amplification <= 1.1
    assert not a.groups_below_range and a.group_bytes == pytest.approx(2.45e6)
    small = advise(20_000_000, 2, 1, stored_bytes=200e9)
    assert small.rows_per_group == 1600 and small.num_shards == 781  # 16 MB, 256 MB


def test_too_small_data_says_how_many_readers_it_feeds() -> None:
    """8 bytes a row: a 64 KB group is 8,000 rows, which a part needs 159,980 records for;
    1,000,000 records feed 6 readers, as any split of them: 7 are too many."""
    a = advise(1_000_000, 8, 2, bytes_per_row=8.0)
    assert not a.fits and a.readers_fed == 1_000_000 // records_needed(8000) == 6
    assert a.rows_per_group == a.max_rows_per_group == max_rows_per_group(62_500)
    assert a.worst_amplification <= 1.1  # the layout given still keeps the target
    for world, workers in [(6, 1), (3, 2), (2, 3), (1, 6)]:
        assert advise(1_000_000, world, workers, bytes_per_row=8.0).fits
    assert not advise(1_000_000, 7, 1, bytes_per_row=8.0).fits
    assert advise(100, 1, 1, bytes_per_row=8.0).fits  # one reader never re-reads
    with pytest.raises(ValueError, match="bytes_per_row must be > 0"):
        advise(100, 2, 1, bytes_per_row=0.0)


# --- the planner's advice, on real files ---------------------------------------------------

PAYLOAD = 2000  # random (incompressible) bytes a row: bytes per row about uniform


def _rows(first: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(first)
    return pd.DataFrame(
        {"id": np.arange(first, first + n), "blob": [rng.bytes(PAYLOAD) for _ in range(n)]}
    )


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(list(argv)) == 0
    return doc, capsys.readouterr().out


def _wrapped(out: str) -> bool:
    """Lines of at most 100 columns, but the command (a path) is left whole, to copy."""
    lines = [line for line in out.splitlines() if not line.startswith("    shardstream-write")]
    return all(len(line) <= 100 for line in lines)


@pytest.fixture
def pandas_files(tmp_path: Path) -> Path:
    """3 files of 2,000 rows (4 MB) written by pandas: one row group each."""
    folder = tmp_path / "pandas"
    folder.mkdir()
    for k in range(3):
        _rows(k * 2000, 2000).to_parquet(folder / f"part-{k}.parquet")
    assert pq.ParquetFile(folder / "part-0.parquet").metadata.num_row_groups == 1
    return folder


def test_one_group_files_get_advice_computed_from_the_data(
    capsys: pytest.CaptureFixture[str], pandas_files: Path
) -> None:
    """4 ranks x 2 workers over 6,000 records: parts of 750 records in 2,000-row groups
    fetch 2.67x or more; the advice is 38-row groups (1 + 750 // 20), one 12 MB shard;
    for 2 x 2 (parts of 1,500) it is 76: the numbers follow the job and the data."""
    doc, out = _plan(capsys, str(pandas_files), "--world-size", "4", "--workers", "2")
    assert doc["read_amplification"] > 2.5 and doc["worst_worker"]["amplification"] > 2.6
    a = doc["advice"]
    assert a["verdict"] == "fits" and a["current_rows_per_group"] == 2000
    assert (a["records_per_reader"], a["rows_per_group"], a["num_shards"]) == (750, 38, 1)
    assert a["worst_amplification"] == pytest.approx(1 + 2 * 37 / 750)
    assert a["group_bytes"] == pytest.approx(38 * doc["bytes_stored"] / 6000, abs=1)
    command = f"shardstream-write {pandas_files} DEST --world-size 4 --workers 2"
    assert a["command"] == command and f"    {command}\n" in out
    text = " ".join(out.split())
    assert "row_group_size=38 " in text and "amplification wins" in text
    assert "3 of 3 shards are one row group each" in text
    assert _wrapped(out)
    other, _ = _plan(capsys, str(pandas_files), "--world-size", "2", "--workers", "2")
    assert other["advice"]["rows_per_group"] == 76


def test_the_advised_layout_reads_within_the_target(
    capsys: pytest.CaptureFixture[str], pandas_files: Path, tmp_path: Path
) -> None:
    """Written as advised (pyarrow, one shard of 38-row groups), the same job plans at most
    1.1x for every worker, in several epochs, and the planner says the layout is fine."""
    job = ["--world-size", "4", "--workers", "2"]
    a = _plan(capsys, str(pandas_files), *job)[0]["advice"]
    table = pa.concat_tables(
        [pq.read_table(p) for p in sorted(pandas_files.glob("*.parquet"))]
    ).combine_chunks()
    out_dir = tmp_path / "advised"
    out_dir.mkdir()
    for k in range(a["num_shards"]):
        part = table.slice(k * a["rows_per_shard"], a["rows_per_shard"])
        pq.write_table(part, out_dir / f"{k}.parquet", row_group_size=a["rows_per_group"])
    for epoch in ("0", "1", "2"):
        doc, out = _plan(capsys, str(out_dir), *job, "--epoch", epoch, "--seed", "3")
        assert doc["read_amplification"] <= 1.1
        assert doc["worst_worker"]["amplification"] <= 1.1
        assert all(w["amplification"] <= 1.1 for w in doc["per_worker"])
        assert doc["advice"]["current_fits"] is True
        text = " ".join(out.split())
        assert "layout: fine for 4 ranks x 2 workers" in text and "shardstream-write" not in text


def test_too_small_data_gets_the_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """1,000 small rows (pandas, one row group) for 8 ranks x 2 workers: too small, and how
    many readers it can feed, computed from its bytes a row."""
    path = tmp_path / "small.parquet"
    pd.DataFrame({"x": np.arange(1000)}).to_parquet(path)
    doc, out = _plan(capsys, str(path), "--world-size", "8", "--workers", "2")
    a = doc["advice"]
    expected = advise(1000, 8, 2, stored_bytes=doc["bytes_stored"])
    assert a["verdict"] == "too_small" and a["readers_fed"] == expected.readers_fed
    assert a["rows_per_group"] == expected.rows_per_group
    per_row = doc["bytes_stored"] / 1000
    assert a["readers_fed"] == max(
        1, 1000 // records_needed(int(np.ceil(MIN_GROUP_BYTES / per_row)))
    )
    text = " ".join(out.split())
    assert "the data is too small for 8 ranks x 2 workers" in text
    fed = a["readers_fed"]
    assert f"it can feed {fed} reader{'s' if fed != 1 else ''} (ranks x workers)" in text
    assert _wrapped(out)
