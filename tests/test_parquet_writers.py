"""Parquet from other writers: schemas that differ only in order, nullability or naming,
column names with dots, legacy parquet-mr footers; local and S3 read alike, as
pyarrow.dataset reads them."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardError, ShardIndex, StreamingDataset


def records(source: Any, **kw: Any) -> list[dict[str, Any]]:
    return sorted(StreamingDataset(source, shuffle=False, **kw), key=lambda r: r["id"])


def upload(s3: Any, local: Path, bucket: str) -> str:
    fs = s3.fs()
    fs.mkdir(bucket)
    for p in sorted(local.iterdir()):
        fs.put_file(str(p), f"{bucket}/d/{p.name}")
    return f"s3://{bucket}/d/"


def test_writers_differing_in_order_nullability_and_naming_unify(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    fastparquet = pytest.importorskip("fastparquet")
    datasets = pytest.importorskip("datasets")
    d = tmp_path / "d"
    d.mkdir()
    # pyarrow: string, list<element>; pandas 3: large_string; polars: large_list, its own
    # column order; duckdb: NOT NULL columns; HF datasets via its own writer
    pq.write_table(
        pa.table({"id": [0, 1], "text": ["a", "b"], "tok": [[1, 2], [3, 4]]}), d / "a.parquet"
    )
    pd.DataFrame({"id": [2, 3], "text": ["c", "d"], "tok": [[5, 6], [7, 8]]}).to_parquet(
        d / "b.parquet"
    )
    pl.DataFrame({"tok": [[9, 10]], "text": ["e"], "id": [4]}).write_parquet(d / "c.parquet")
    duckdb.sql(
        "COPY (SELECT 5::BIGINT AS id, 'f' AS text, [11, 12]::BIGINT[] AS tok) "
        f"TO '{d / 'e.parquet'}' (FORMAT PARQUET)"
    )
    datasets.Dataset.from_dict({"id": [6], "text": ["g"], "tok": [[13, 14]]}).to_parquet(
        str(d / "f.parquet")
    )
    fastparquet.write(str(d / "g.parquet"), pd.DataFrame({"id": np.array([7]), "text": ["h"]}))
    common = ["id", "text"]
    want = sorted(pads.dataset(str(d)).to_table(columns=common).to_pylist(), key=lambda r: r["id"])
    assert records(str(d), columns=common) == want and len(want) == 8
    # fastparquet's shard has no "tok": asking for it names that shard
    with pytest.raises(ShardError, match=r"g.parquet: has no column 'tok'"):
        StreamingDataset(str(d), columns=["id", "tok"])
    (d / "g.parquet").unlink()
    got = records(str(d), columns=["id", "tok"], batch_size=None)
    assert [r["tok"] for r in got] == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14]]
    batches = list(StreamingDataset(str(d), columns=["id", "tok"], batch_size=7, shuffle=False))
    assert batches[0]["tok"].shape == (7, 2)


def test_conflicting_types_name_shard_field_and_both_types(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1], "x": pa.array([1], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2], "x": pa.array(["s"])}), tmp_path / "b.parquet")
    with pytest.raises(
        ShardError,
        match=r"b.parquet: column 'x' is string, but .*a.parquet"
        r" has it as int64",
    ):
        StreamingDataset(str(tmp_path))
    assert [r["id"] for r in records(str(tmp_path), columns=["id"])] == [1, 2]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_column_names_with_dots(tmp_path: Path, s3: Any, where: str) -> None:
    table = pa.table(
        {
            "id": np.arange(50),
            "feat.x": np.arange(50) * 2.0,
            "feat": np.arange(50) * 3,
            "s": pa.array([{"a": i, "b.c": str(i)} for i in range(50)]),
        }
    )
    (tmp_path / "d").mkdir()
    pq.write_table(table, tmp_path / "d" / "a.parquet", row_group_size=16)
    source = str(tmp_path / "d") if where == "local" else upload(s3, tmp_path / "d", "dots")
    opts = s3.storage_options if where == "s3" else None
    got = records(source, columns=["id", "feat.x"], storage_options=opts)
    assert got == [{"id": i, "feat.x": i * 2.0} for i in range(50)]
    got = records(source, columns=["id", "feat", "s"], storage_options=opts)
    assert got == table.select(["id", "feat", "s"]).to_pylist()


def _legacy_parquet_mr_file(path: Path) -> pa.Table:
    """A file whose footer says what parquet-mr 1.8 (Spark 2.x) wrote: dictionary_page_offset
    0 on chunks without a dictionary (PARQUET-1402). The footer is rewritten with
    fastparquet's Thrift classes; the pages are pyarrow's."""
    fastparquet = pytest.importorskip("fastparquet")
    table = pa.table({"id": np.arange(100), "s": [f"x{i % 7}" for i in range(100)]})
    pq.write_table(table, path, use_dictionary=["s"], row_group_size=40)
    fmd = fastparquet.ParquetFile(str(path)).fmd
    zeroed = 0
    for rg in fmd.row_groups:
        for c in rg.columns:
            if c.meta_data.dictionary_page_offset is None:
                c.meta_data.dictionary_page_offset = 0
                zeroed += 1
    assert zeroed == 3
    fmd.created_by = "parquet-mr version 1.8.1 (build 4aba4dae7bb0d4edbcf7923ae1339f28fd3f7fcf)"
    raw = path.read_bytes()
    n = struct.unpack("<i", raw[-8:-4])[0]
    footer = fmd.to_bytes()
    path.write_bytes(raw[: len(raw) - 8 - n] + footer + struct.pack("<i", len(footer)) + b"PAR1")
    meta = pq.read_metadata(path).row_group(1).column(0)
    assert meta.has_dictionary_page and meta.dictionary_page_offset == 0
    return table


@pytest.mark.parametrize("where", ["local", "s3"])
def test_legacy_footer_with_dictionary_page_offset_zero(
    tmp_path: Path, s3: Any, where: str
) -> None:
    (tmp_path / "d").mkdir()
    table = _legacy_parquet_mr_file(tmp_path / "d" / "a.parquet")
    source = str(tmp_path / "d") if where == "local" else upload(s3, tmp_path / "d", "legacy")
    opts = s3.storage_options if where == "s3" else None
    assert records(source, storage_options=opts) == table.to_pylist()
    index = ShardIndex.build(source, opts)
    offsets = index.shards[0].details["row_group_offsets"]
    assert offsets[0] == 4 and offsets == sorted(offsets)  # no row group starts at byte 0
