"""filter= and split= (loader.selection), against pyarrow.dataset as the reference.

The data: pandas-written Parquet files (strings, floats with nulls, lists of strings with
nulls, structs), read in every case as whole records, every column, compared with what
pyarrow.dataset yields for the same filter. A filter's passing rows are decided once, before
reading, so every rank knows its count (`len`), all ranks read as many, each passing record
once an epoch, and resume is unchanged; a split is a seeded fraction of each shard.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from shardstream.loader import Pack, ShardError, Stream, StreamingDataset
from shardstream.loader.index.shard_index import ShardIndex
from tests.helpers import check_resume

LANGS = ["en", "de", "fr", "en", "ja"]
SIZES = [230, 0, 170, 311, 90, 205]
EN = pc.field("lang") == "en"
GOOD = (pc.field("lang") == "en") & (pc.field("score") > 0.3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pandas")
    rng = np.random.default_rng(7)
    first = 0
    for k, n in enumerate(SIZES):
        ids = np.arange(first, first + n)
        first += n
        score = rng.random(n)
        df = pd.DataFrame(
            {
                "id": ids,
                "lang": [LANGS[i % 5] for i in ids],
                "score": np.where(ids % 11 == 0, np.nan, score),
                "tags": [None if i % 7 == 0 else [f"t{i % 3}"] * (i % 4) for i in ids],
                "meta": [{"src": f"s{i % 2}", "n": int(i)} for i in ids],
            }
        )
        df.to_parquet(root / f"part-{k}.parquet", row_group_size=40, index=False)
    return root


def reference(folder: Path, expr: pc.Expression | None = None) -> dict[int, dict[str, Any]]:
    """id -> the record pyarrow.dataset reads (every column), of the records passing."""
    table = pads.dataset(str(folder)).to_table(filter=expr)
    return {r["id"]: r for r in table.to_pylist()}


def test_a_filtered_dataset_yields_pyarrow_records_across_three_ranks(folder: Path) -> None:
    want = reference(folder, GOOD)
    assert 0 < len(want) < sum(SIZES) // 4
    for drop_last in (False, True):
        per_rank = []
        for rank in range(3):
            ds = StreamingDataset(
                str(folder), filter=GOOD, num_replicas=3, rank=rank, drop_last=drop_last
            )
            ds.set_epoch(2)
            rows = list(ds)
            assert len(rows) == len(ds)
            per_rank.append(rows)
        counts = {len(r) for r in per_rank}
        assert counts == {len(want) // 3 if drop_last else -(-len(want) // 3)}
        seen = [r["id"] for rows in per_rank for r in rows]
        for rows in per_rank:
            for row in rows:
                assert row == want[row["id"]]  # whole records: every column
        if drop_last:
            assert len(set(seen)) == len(seen) == 3 * (len(want) // 3)
        else:
            assert set(seen) == set(want)  # each passing record, padded by wrapping


def test_filter_on_a_column_not_read_and_batches(folder: Path) -> None:
    want = reference(folder, EN)
    ds = StreamingDataset(str(folder), filter=EN, columns=["id", "score"], batch_size=16)
    ids = [i for b in ds for i in b["id"].tolist()]
    assert sorted(ids) == sorted(want) and len(ds) == -(-len(want) // 16)
    arrow = StreamingDataset(str(folder), filter=EN, batch_size=16, batch_format="arrow")
    got = pa.Table.from_batches(list(arrow)).sort_by("id")
    assert got.equals(pads.dataset(str(folder)).to_table(filter=EN).sort_by("id"))


def test_resume_of_a_filtered_split_dataset(folder: Path) -> None:
    def make() -> StreamingDataset:
        return StreamingDataset(str(folder), filter=GOOD, split=(0, 0.8), seed=3, batch_size=5)

    check_resume(make, [1, 7, 13], key=lambda b: b["id"].tolist())


def test_elastic_resume_of_a_filtered_dataset_reads_each_record_once(folder: Path) -> None:
    """Three ranks stop after 4 records each; two ranks finish the epoch: every passing
    record is read once."""
    want = reference(folder, EN)
    first = [
        StreamingDataset(str(folder), filter=EN, num_replicas=3, rank=r, drop_last=True)
        for r in range(3)
    ]
    head = [row["id"] for ds in first for _, row in zip(range(4), ds)]
    state = first[0].consumed_state(4, 0)
    rest = []
    for rank in range(2):
        ds = StreamingDataset(str(folder), filter=EN, num_replicas=2, rank=rank, drop_last=True)
        ds.load_state_dict(state)
        rest += [row["id"] for row in ds]
    read = head + rest
    assert len(read) == len(set(read)) and set(read) <= set(want)
    assert len(want) - len(read) < 3  # drop_last leaves out fewer than num_replicas


def test_a_sorted_files_filter_fetches_only_its_row_groups(tmp_path: Path) -> None:
    """Sorted ids in 20 row groups; a filter on 2 of them: the other 18 are never
    fetched (statistics), and the epoch reads at most 15% of the file's bytes."""
    n = 20_000
    table = pa.table({"id": np.arange(n), "text": [f"row {i} " * 8 for i in range(n)]})
    path = tmp_path / "sorted.parquet"
    pq.write_table(table, path, row_group_size=1000)
    meta = pq.ParquetFile(path).metadata
    expr = (pc.field("id") >= 4000) & (pc.field("id") < 6000)
    ds = StreamingDataset(str(path), filter=expr, batch_size=256)
    ids = [i for b in ds for i in b["id"].tolist()]
    assert sorted(ids) == list(range(4000, 6000))
    groups = sum(meta.row_group(g).total_byte_size for g in (4, 5))
    chunks = sum(
        meta.row_group(g).column(c).total_compressed_size for g in (4, 5) for c in range(2)
    )
    fetched = ds.stats()["bytes_fetched"]
    assert fetched <= chunks + 1024, (fetched, chunks, groups)
    assert fetched <= 0.15 * path.stat().st_size
    view = ds.view.table.column("row_group_rows").to_pylist()[0]
    assert view == [0] * 4 + [1000, 1000] + [0] * 14


def test_the_passing_rows_are_kept_in_the_saved_index(
    folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shardstream.loader.selection")
    ds = StreamingDataset(str(folder), filter=GOOD, seed=1)
    assert any("evaluated filter" in r.message for r in caplog.records)
    rows = list(ds)
    ds.index.save(tmp_path / "good.index.arrow")
    caplog.clear()
    again = StreamingDataset(str(tmp_path / "good.index.arrow"), filter=GOOD, seed=1)
    assert not any("evaluated filter" in r.message for r in caplog.records)
    assert list(again) == rows
    loaded = ShardIndex.load(tmp_path / "good.index.arrow")
    assert f"filter:{GOOD}" in loaded.table.column_names
    # another filter is evaluated (and kept beside the first)
    other = StreamingDataset(str(tmp_path / "good.index.arrow"), filter=EN)
    assert {r["id"] for r in other} == set(reference(folder, EN))


def test_splits_are_disjoint_covering_seeded_and_rank_free(folder: Path) -> None:
    every = set(reference(folder))
    train = {r["id"] for r in StreamingDataset(str(folder), split=(0, 0.9), seed=5)}
    val = {r["id"] for r in StreamingDataset(str(folder), split=(0.9, 1), seed=5)}
    assert not train & val and train | val == every
    for k, n in enumerate(SIZES):  # each shard within a record of its share
        first = sum(SIZES[:k])
        inside = sum(1 for i in val if first <= i < first + n)
        assert abs(inside - 0.1 * n) <= 1, (k, inside, n)
    other = {r["id"] for r in StreamingDataset(str(folder), split=(0.9, 1), seed=6)}
    assert other != val and len(other) == pytest.approx(len(val), abs=len(SIZES))
    four = set()
    for rank in range(4):
        ds = StreamingDataset(str(folder), split=(0.9, 1), seed=5, num_replicas=4, rank=rank)
        ds.set_epoch(3)
        four |= {r["id"] for r in ds}
    assert four == val
    thirds = [(0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1)]
    parts = [{r["id"] for r in StreamingDataset(str(folder), split=s, filter=EN)} for s in thirds]
    assert sum(len(p) for p in parts) == len(set().union(*parts)) == len(reference(folder, EN))


def test_records_come_whole_from_a_split(folder: Path) -> None:
    want = reference(folder)
    for row in StreamingDataset(str(folder), split=(0.25, 0.5), seed=9):
        assert row == want[row["id"]]


def test_mixture_streams_filter_and_split(folder: Path) -> None:
    en, rest = reference(folder, EN), reference(folder)
    streams = [
        Stream(str(folder), name="en", filter=EN, weight=0.5),
        Stream(str(folder), name="val", split=(0.9, 1), weight=0.5),
    ]
    ds = StreamingDataset(streams, epoch_size=200, seed=2)
    val = {r["id"] for r in StreamingDataset(str(folder), split=(0.9, 1), seed=2)}
    rows = list(ds)
    assert len(rows) == 200
    for row in rows:
        name = row.pop("__stream__")
        assert row == rest[row["id"]]
        assert row["id"] in (en if name == "en" else val)


def test_pack_packs_the_filtered_documents(tmp_path: Path) -> None:
    docs = [[i] * (1 + i % 9) for i in range(300)]
    keep = [i % 3 != 0 for i in range(300)]
    pq.write_table(
        pa.table({"tokens": pa.array(docs, pa.list_(pa.int64())), "keep": keep}),
        tmp_path / "t.parquet",
        row_group_size=50,
    )
    ds = StreamingDataset(
        str(tmp_path / "t.parquet"), pack=Pack("tokens", 8, eos=-1), filter=pc.field("keep")
    )
    passing = [d for d, k in zip(docs, keep) if k]
    stats = ds.stats()["pack"]
    assert stats["documents"] == len(passing)
    assert stats["tokens"] == sum(len(d) + 1 for d in passing)
    seen = {int(t) for b in ds for t in b["tokens"].flatten().tolist() if t >= 0}
    assert seen <= {i for i in range(300) if keep[i]} and seen


def test_bad_filters_and_splits_are_refused_by_name(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"pyarrow\.compute\.Expression"):
        StreamingDataset(str(folder), filter="lang == 'en'")
    with pytest.raises(ShardError, match=r"part-0\.parquet.*nope"):
        StreamingDataset(str(folder), filter=pc.field("nope") > 1)
    for bad in [(0.5, 0.5), (-0.1, 0.5), (0.2, 1.5)]:
        with pytest.raises(ValueError, match=r"split=\("):
            StreamingDataset(str(folder), split=bad)
    with pytest.raises(TypeError, match="split must be"):
        StreamingDataset(str(folder), split=0.9)
    with pytest.raises(TypeError, match="Expression"):
        Stream(str(folder), filter=lambda r: True)
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "txt": "hello"})
    with pytest.raises(ValueError, match="tar shards"):
        StreamingDataset(str(tmp_path / "a.tar"), split=(0, 0.5))


def test_s3_filter_fetches_only_passing_groups(tmp_path: Path, s3: Any) -> None:
    """Over S3 (moto's server, bytes counted by a proxy in front of it): the records
    pyarrow.dataset's filter gives, and the filter of a sorted file that 1 row group of 10
    passes fetches at most 15% of its bytes: evaluating it (statistics, then its column in
    the kept group) and reading the records."""
    from tests.s3proxy import counting_proxy

    n = 20_000
    rng = np.random.default_rng(3)
    text = [rng.bytes(48).hex() for _ in range(n)]  # ~2 MB that does not compress
    table = pa.table({"id": np.arange(n), "text": text})
    pq.write_table(table, tmp_path / "sorted.parquet", row_group_size=2000)
    size = (tmp_path / "sorted.parquet").stat().st_size
    fs = s3.fs()
    fs.mkdir("sel")
    fs.put(str(tmp_path / "sorted.parquet"), "sel/data/sorted.parquet")
    expr = (pc.field("id") >= 6000) & (pc.field("id") < 8000)
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        ds = StreamingDataset("s3://sel/data/", filter=expr, storage_options=opts)
        rows = list(ds)
    want = pads.dataset(str(tmp_path)).to_table(filter=expr).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == want
    assert proxy.object_bytes <= 0.15 * size, (proxy.object_bytes, size)


def test_torchrun_ranks_evaluate_a_share_and_read_disjoint_shares(folder: Path) -> None:
    from .conftest import REPO, torchrun

    out = torchrun(REPO / "tests" / "dist" / "filter_allgather.py", str(folder), nproc=2)
    line = next(x for x in out[0].splitlines() if x.startswith("RANKS "))
    ranks = json.loads(line[6:])
    alone = StreamingDataset(str(folder), filter=EN)
    kept = alone.index.table.column(f"filter:{EN}").to_pylist()
    assert all(r["kept"] == kept for r in ranks)
    ids = [i for r in ranks for i in r["ids"]]
    assert len(ids) == len(set(ids)) == 2 * (len(reference(folder, EN)) // 2)
    assert all(r["len"] == len(reference(folder, EN)) // 2 for r in ranks)


def test_a_dataset_without_a_filter_imports_neither_pandas_nor_pyarrow_dataset() -> None:
    """pyarrow.dataset (with pandas) is ~350 modules: at import, and in every full garbage
    collection after (measured: a record-mode pass 1.0 -> 1.7 us a record when one fell in
    it). Only a filter imports them."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from shardstream import StreamingDataset\n"
        "print(sorted(m for m in ('pandas', 'pyarrow.dataset') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
