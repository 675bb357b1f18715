"""batch_format= ("torch", "numpy", "arrow", "pandas") and ds.head(n) / ds.take(n).

Arrow and pandas batches are compared with what pyarrow.dataset reads for the same files:
strings, structs, nulls and ragged lists as they are, no pad or fill_nulls. (Every mode's
rows are whole records: tests/test_row_is_record.py draws the formats too.)
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import Pack, Stream, StreamingDataset

SIZES = [100, 37, 0, 64]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    first = 0
    for k, n in enumerate(SIZES):
        ids = list(range(first, first + n))
        first += n
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": [None if i % 5 == 0 else f"n{i}" for i in ids],
                "maybe": pa.array([None if i % 3 == 0 else i for i in ids], pa.int32()),
                "ragged": [None if i % 7 == 0 else list(range(i % 6)) for i in ids],
                "point": [{"x": float(i), "y": None if i % 2 else "odd"} for i in ids],
                "day": pa.array([i * 86_400 for i in ids], pa.timestamp("s")),
            }
        )
        pq.write_table(table, root / f"part-{k}.parquet", row_group_size=16)
    return root


def whole(folder: Path) -> pa.Table:
    return pads.dataset(str(folder)).to_table()


@pytest.mark.parametrize("workers", [0, 2])
def test_arrow_batches_are_pyarrows_rows(folder: Path, workers: int) -> None:
    ds = StreamingDataset(str(folder), batch_size=10, batch_format="arrow", shuffle=False)
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert len(batches) == len(ds) == -(-sum(SIZES) // 10)
    assert [b.num_rows for b in batches] == [10] * 20 + [1]
    got = pa.Table.from_batches(batches)
    want = whole(folder)
    if workers:  # workers' batches arrive in turn: the same rows
        got, want = got.sort_by("id"), want.sort_by("id")
    assert got.equals(want)


def test_pandas_batches_are_pyarrows_to_pandas(folder: Path) -> None:
    ds = StreamingDataset(str(folder), batch_size=32, batch_format="pandas", seed=4)
    frames = list(ds)
    assert all(isinstance(f, pd.DataFrame) for f in frames)
    got = pd.concat(frames, ignore_index=True)
    table = whole(folder)
    want = table.take(pa.array(np.argsort(np.argsort(table["id"].to_numpy())))).to_pandas()
    order = pd.Index(want["id"]).get_indexer(got["id"])
    want = want.iloc[order].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)


def test_numpy_batches_are_pyarrows_to_numpy(folder: Path) -> None:
    ds = StreamingDataset(str(folder), batch_size=50, batch_format="numpy", shuffle=False)
    batches = list(ds)
    table = whole(folder)
    for name in table.column_names:
        got = np.concatenate([b[name] for b in batches])
        want = table.column(name).to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype, name
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same = (g is w) or (isinstance(g, np.ndarray) and np.array_equal(g, w))
            assert same or g == w or (g != g and w != w), (name, g, w)


def test_arrow_batches_of_a_filtered_split_dataset(folder: Path) -> None:
    import pyarrow.compute as pc

    expr = pc.field("maybe").is_valid()
    train = StreamingDataset(
        str(folder), batch_size=8, batch_format="arrow", filter=expr, split=(0, 0.75)
    )
    val = StreamingDataset(
        str(folder), batch_size=8, batch_format="arrow", filter=expr, split=(0.75, 1)
    )
    both = pa.Table.from_batches([*train, *val]).sort_by("id")
    assert both.equals(pads.dataset(str(folder)).to_table(filter=expr).sort_by("id"))


def test_formats_are_refused_where_they_mean_nothing(folder: Path) -> None:
    with pytest.raises(ValueError, match="batch_format must be one of"):
        StreamingDataset(str(folder), batch_size=4, batch_format="polars")
    with pytest.raises(ValueError, match="pass batch_size"):
        StreamingDataset(str(folder), batch_format="arrow")
    with pytest.raises(ValueError, match="pad shape the tensors"):
        StreamingDataset(str(folder), batch_size=4, batch_format="arrow", pad={"ragged": 0})
    with pytest.raises(ValueError, match="packed blocks are tensors"):
        StreamingDataset(
            str(folder), batch_size=4, batch_format="numpy", pack=Pack("ragged", 4, eos=-1)
        )
    streams = [Stream(str(folder), name="a"), Stream(str(folder), name="b")]
    with pytest.raises(ValueError, match="a mixture's batches are torch's"):
        StreamingDataset(streams, epoch_size=10, batch_size=4, batch_format="arrow")


def test_head_is_the_epochs_first_items_and_leaves_the_dataset_alone(tmp_path: Path) -> None:
    """head(n) gives what iteration gives first; it reads about the groups those items
    lie in, and the dataset's own pass, position and warnings are untouched."""
    for k in range(20):
        ids = np.arange(k * 1000, (k + 1) * 1000)
        table = pa.table({"id": ids, "text": [f"{i:08d}" * 16 for i in ids]})
        pq.write_table(table, tmp_path / f"p{k:02d}.parquet", row_group_size=250)
    in_order = StreamingDataset(str(tmp_path), batch_size=7, columns=["id"], shuffle=False)
    heads = [b["id"].tolist() for b in in_order.head(3)]
    assert heads == [list(range(7 * k, 7 * k + 7)) for k in range(3)]
    # one read group: the first shard's 4 row groups (their id chunks coalesced, with
    # the small gaps between them), of 20 shards
    assert 0 < in_order.stats()["bytes_fetched"] <= (tmp_path / "p00.parquet").stat().st_size
    ds = StreamingDataset(str(tmp_path), batch_size=7, columns=["id"], seed=1)
    ds.set_epoch(2)
    first = ds.head(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "another pass without set_epoch()"
        batches = list(ds)
        assert ds.state_dict()["position"] == len(ds)
    assert all(a["id"].tolist() == b["id"].tolist() for a, b in zip(first, batches))
    records = ds.take(10)
    assert [r["id"] for r in records] == [i for b in batches for i in b["id"].tolist()][:10]
    assert records[0] == {"id": records[0]["id"]}
    assert ds.head(0) == [] and len(ds.take(10**6)) == 20_000


def test_take_of_a_mixture_and_errors(folder: Path) -> None:
    streams = [Stream(str(folder), name="a"), Stream(str(folder), name="b")]
    ds = StreamingDataset(streams, epoch_size=40, batch_size=4, columns=["id", "name"])
    records = ds.take(5)
    assert [r["id"] for r in records] == [i for b in ds.head(2) for i in b["id"].tolist()][:5]
    assert {r["__stream__"] for r in records} <= {"a", "b"}
    with pytest.raises(ValueError, match="n must be"):
        ds.head(-1)
