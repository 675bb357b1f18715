"""The column chunks' places in the index (`column_chunk_offsets` / `_bytes`): a job
reading a saved index fetches each shard's footer together with its first column chunks,
one round trip, not the footer's and then the chunks'. The places must cover every leaf
chunk pyarrow reads (whatever wrote the file), the records must be those pyarrow reads,
and an index saved before the places were recorded still reads, the footer first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardIndex, StreamingDataset
from shardstream.loader.formats.parquet.meta import (
    FOOTERS,
    SCANS,
    column_ranges,
    footer_details,
    parse_footer,
)
from shardstream.loader.index.beside import INDEX_NAME, save_beside
from tests.corpora import corpus_names, same, unpack
from tests.s3proxy import IN_LINE, CountingProxy, counting_proxy, least_in_line

PLACES = ("column_chunk_offsets", "column_chunk_bytes")


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    return data[-n - 8 :]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return unpack(tmp_path_factory.mktemp("corpora"))


def test_the_places_cover_every_leaf_chunk_of_the_corpus(corpus: dict[str, Path]) -> None:
    """Every parquet-testing file pyarrow reads: each top-level column's place in each row
    group holds all of its leaf chunks as `column_ranges` (the footer's) gives them."""
    checked = 0
    for name in corpus_names():
        if not name.startswith("parquet/"):
            continue
        path = corpus[name]
        try:
            pq.read_table(path)
            meta, found = footer_details(_footer(path), name)
        except Exception:
            continue  # refused by pyarrow or by the index (test_corpora checks how)
        d = found["details"]
        names = pq.ParquetFile(path).schema_arrow.names
        assert len(d["column_chunk_offsets"]) == len(names), name
        for c, column in enumerate(names):
            for g in range(meta.num_row_groups):
                at = d["column_chunk_offsets"][c][g]
                end = at + d["column_chunk_bytes"][c][g]
                starts, ends = column_ranges(name, parse_footer(_footer(path)), [g], [column])
                assert all(at <= a and b <= end for a, b in zip(starts, ends)), (name, column, g)
        checked += 1
    assert checked >= 60  # the corpus's Parquet files pyarrow and the index read (61 of 63)


def _table(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "nested": pa.array(
                [{"a": i, "tags": [f"t{i}", f"u{i % 7}"]} for i in range(n)],
                pa.struct([("a", pa.int32()), ("tags", pa.list_(pa.string()))]),
            ),
            "text": pa.array([f"record {i} " * (i % 13) for i in range(n)]),
            "tokens": pa.array([[i, i + 1, i + 2] for i in range(n)], pa.list_(pa.int32())),
        }
    )


def _upload(s3: Any, name: str, places: bool) -> str:
    """Three shards of row groups of 50 under s3://chunks/<name>, a saved index beside
    them (without the places: as an index saved before they were recorded), and this
    process's parsed footers forgotten (as a fresh job holds none). The prefix's URL."""
    fs = s3.fs()
    if not fs.exists("chunks"):
        fs.mkdir("chunks")
    for k in range(3):
        with fs.open(f"chunks/{name}/part-{k}.parquet", "wb") as f:
            pq.write_table(_table(230).slice(k * 80, 80), f, row_group_size=50)
    url = f"s3://chunks/{name}"
    index = ShardIndex.build(url, s3.storage_options)
    save_beside(index, f"{url}/{INDEX_NAME}", s3.storage_options)
    if not places:
        with fs.open(f"chunks/{name}/{INDEX_NAME}", "rb") as f:
            table = pa.ipc.open_file(f).read_all()
        assert set(PLACES) <= set(table.column_names)
        sink = pa.BufferOutputStream()
        older = table.drop_columns(list(PLACES))
        with pa.ipc.new_file(sink, older.schema) as w:
            w.write_table(older)
        fs.pipe(f"chunks/{name}/{INDEX_NAME}", sink.getvalue().to_pybytes())
    FOOTERS.clear()
    SCANS.clear()
    return url


def _want(s3: Any, url: str, columns: list[str] | None) -> list[dict[str, Any]]:
    """pyarrow.dataset's rows of the same files, in storage order."""
    fs = s3.fs()
    files = sorted(fs.glob(f"{url[len('s3://') :]}/*.parquet"))
    return pads.dataset(files, filesystem=fs, format="parquet").to_table(columns).to_pylist()


@pytest.mark.parametrize("places", [True, False])
@pytest.mark.parametrize("columns", [None, ["nested", "id"], ["tokens"]])
def test_a_first_read_fetches_the_footer_beside_the_chunks(
    s3: Any, places: bool, columns: list[str] | None
) -> None:
    url = _upload(s3, f"p{int(places)}{len(columns or [])}", places)

    def start() -> tuple[StreamingDataset, list[Any], CountingProxy]:
        FOOTERS.clear()  # as in a new job, which holds none
        SCANS.clear()
        with counting_proxy(s3.endpoint_url, shaping=IN_LINE) as proxy:
            opts = {"client_kwargs": {"endpoint_url": proxy.url}}
            ds = StreamingDataset(url, storage_options=opts, shuffle=False, columns=columns)
            return ds, list(ds), proxy

    # the index's GET, then the footer with the first chunks: 2 in line; an index without
    # the places reads the footer first: 3 (the least of up to 3 starts: least_in_line)
    in_line = 2 if places else 3
    _, got, proxy = least_in_line(start, lambda g: g[0].stats()["first_in_line"], in_line)
    want = _want(s3, url, columns)
    assert same([{k: r[k] for k in (columns or r)} for r in got], want)
    first = min((r for r in proxy.timeline if r[1].endswith("part-0.parquet")), key=lambda r: r[3])
    together = [r for r in proxy.timeline if r[1].endswith("part-0.parquet") and r[3] < first[4]]
    assert len(together) >= (2 if places else 1)  # sent before the first of them came
