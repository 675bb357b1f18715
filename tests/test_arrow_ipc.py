"""Arrow IPC shards (file format, stream format, Feather v2, HF datasets' save_to_disk):
records, batches, columns, resume, S3 and mixtures, as pyarrow reads the same files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from shardstream.loader import MixtureDataset, ShardError, ShardIndex, Stream, StreamingDataset
from tests.helpers import check_resume


def _table(lo: int, n: int) -> pa.Table:
    x = np.arange(lo, lo + n)
    return pa.table(
        {
            "x": x,
            "text": [f"row {i}" for i in x],
            "pair": pa.array([[int(i), int(i) + 1] for i in x], type=pa.list_(pa.int64(), 2)),
        }
    )


def _write(path: Path, table: pa.Table, kind: str, batch: int = 300) -> None:
    if kind == "feather":
        feather.write_feather(table, path, chunksize=batch, compression="zstd")
        return
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with new(path, table.schema) as w:
        for b in table.to_batches(max_chunksize=batch):
            w.write_batch(b)


def _folder(root: Path, kinds: tuple[str, ...] = ("file", "stream", "feather")) -> pa.Table:
    root.mkdir(parents=True, exist_ok=True)
    tables = []
    for k, kind in enumerate(kinds):
        t = _table(k * 1000, 1000)
        suffix = ".feather" if kind == "feather" else ".arrow"
        _write(root / f"part-{k}{suffix}", t, kind)
        tables.append(t)
    return pa.concat_tables(tables)


def test_file_stream_and_feather_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    want = _folder(tmp_path / "d")
    ds = StreamingDataset(str(tmp_path / "d"), shuffle=False)
    assert ds.index.format == "arrow"
    assert list(ds) == want.to_pylist()
    for shard in ds.index.shards:  # batches of 300: the index knows each one
        assert shard.details["row_group_rows"] == [300, 300, 300, 100]


def test_batches_columns_and_ranks(tmp_path: Path) -> None:
    _folder(tmp_path / "d")
    seen = []
    for rank in range(2):
        ds = StreamingDataset(
            str(tmp_path / "d"), num_replicas=2, rank=rank, batch_size=64, columns=["x", "pair"]
        )
        for b in ds:
            assert sorted(b) == ["pair", "x"] and b["pair"].shape[1] == 2
            assert (b["pair"][:, 0] == b["x"]).all()
            seen += b["x"].tolist()
    assert sorted(seen) == list(range(3000))


def test_resume_mid_epoch(tmp_path: Path) -> None:
    _folder(tmp_path / "d")
    index = ShardIndex.build(str(tmp_path / "d"))
    check_resume(
        lambda: StreamingDataset(index, seed=5, columns="x"),
        positions=[1, 299, 1234],
        key=lambda r: r["x"],
    )


def test_hf_save_to_disk_folder_is_a_source(tmp_path: Path) -> None:
    import datasets

    hf = datasets.Dataset.from_dict({"x": list(range(2500)), "t": [str(i) for i in range(2500)]})
    hf.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    ds = StreamingDataset(str(tmp_path / "hf"), shuffle=False)
    assert len(ds.index.shards) == 2  # the .json files beside them are not data
    assert list(ds) == hf.to_list()


def test_over_s3(s3: Any, tmp_path: Path) -> None:
    want = _folder(tmp_path / "d")
    fs = s3.fs()
    fs.mkdir("ipc")
    for p in sorted((tmp_path / "d").iterdir()):
        fs.pipe(f"ipc/d/{p.name}", p.read_bytes())
    ds = StreamingDataset("s3://ipc/d/", storage_options=s3.storage_options, shuffle=False)
    assert list(ds) == want.to_pylist()


def test_a_mixture_of_parquet_and_arrow_forms_batches(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    (tmp_path / "p").mkdir()
    pq.write_table(_table(5000, 500), tmp_path / "p" / "a.parquet")
    _folder(tmp_path / "a", kinds=("stream",))
    ds = MixtureDataset(
        [Stream(str(tmp_path / "p")), Stream(str(tmp_path / "a"))],
        batch_size=50,
        columns=["x"],
    )
    got = [x for b in ds for x in b["x"].tolist()]
    assert set(got) <= set(range(1000)) | set(range(5000, 5500))
    assert any(x < 1000 for x in got) and any(x >= 5000 for x in got)  # both streams read
    assert len(got) == len(set(got))  # no row twice in an epoch


def test_a_truncated_stream_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    _write(path, _table(0, 1000), "stream")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ShardError, match=r"t.arrow: not a readable Arrow IPC file"):
        StreamingDataset(str(path))


def _dictionary_stream(path: Path) -> pa.Table:
    """A stream whose dictionary grows by deltas and is replaced between batches (what a
    writer appending categories emits); pyarrow's table of it, read back."""
    schema = pa.schema([("x", pa.int64()), ("c", pa.dictionary(pa.int32(), pa.string()))])
    words = [["a", "b"], ["a", "b", "c"], ["z", "y"], ["z", "y", "x", "w"], ["q"]]
    options = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    with pa.ipc.new_stream(path, schema, options=options) as w:
        for k, dictionary in enumerate(words):
            xs = list(range(k * 5, k * 5 + 5))
            codes = pa.array([(i * 7) % len(dictionary) for i in xs], pa.int32())
            c = pa.DictionaryArray.from_arrays(codes, pa.array(dictionary))
            w.write_batch(pa.record_batch([pa.array(xs), c], schema=schema))
    reader = pa.ipc.open_stream(path)
    table = reader.read_all()
    assert reader.stats.num_dictionary_deltas > 0 and reader.stats.num_replaced_dictionaries > 0
    return table


def test_dictionaries_read_as_their_values_in_any_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch read alone (shuffled, over two ranks) replays the dictionary messages
    before it: deltas, replacements. Records are pyarrow's, every column."""
    from shardstream.loader.formats.parquet import meta as parquet_meta

    monkeypatch.setattr(parquet_meta, "GROUP_BYTES", 1)  # a read group a record batch
    want = _dictionary_stream(tmp_path / "d.arrow").to_pylist()
    assert {r["c"] for r in want} >= {"a", "c", "z", "w", "q"}
    for seed in range(3):
        got = []
        for rank in range(2):
            ds = StreamingDataset(str(tmp_path / "d.arrow"), num_replicas=2, rank=rank, seed=seed)
            got += list(ds)
        assert all(r == want[r["x"]] for r in got)  # whole records (x is the row number)
        assert {r["x"] for r in got} == set(range(len(want)))  # (one padded: 25 rows, 2 ranks)
        batches = StreamingDataset(str(tmp_path / "d.arrow"), batch_size=4, seed=seed)
        rows = [(x, c) for b in batches for x, c in zip(b["x"].tolist(), b["c"])]
        assert sorted(rows) == [(r["x"], r["c"]) for r in want]


def test_polars_categoricals_read_as_their_values(tmp_path: Path) -> None:
    import polars as pl

    df = pl.DataFrame(
        {"x": [1, 2, 3, 4], "c": ["red", "blue", None, "red"]},
        schema={"x": pl.Int64, "c": pl.Categorical},
    )
    df.write_ipc(tmp_path / "f.arrow")
    df.write_ipc_stream(tmp_path / "s.ipc")
    want = df.with_columns(pl.col("c").cast(pl.Utf8)).to_dicts()
    # what polars wrote: dictionaries, in both formats
    assert pa.types.is_dictionary(pa.ipc.open_file(tmp_path / "f.arrow").schema[1].type)
    assert pa.types.is_dictionary(pa.ipc.open_stream(tmp_path / "s.ipc").schema[1].type)
    for name in ("f.arrow", "s.ipc"):
        assert list(StreamingDataset(str(tmp_path / name), shuffle=False)) == want


def test_newer_types_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """Views, run-end encoding, list views whose offsets go backwards (pyarrow 26 casts
    those to wrong lists) and the UUID extension type: records as pyarrow's to_pylist;
    batches of the plain columns. Feather version 1 is read."""
    import uuid
    import warnings

    import pyarrow.compute as pc

    offsets, sizes = pa.array([1, 0, 0], pa.int32()), pa.array([2, 1, 0], pa.int32())
    table = pa.table(
        {
            "id": pa.array([1, 2, 3]),
            "s": pa.array(["a", None, "c"]).cast(pa.string_view()),
            "b": pa.array([b"x", b"y", None]).cast(pa.binary_view()),
            "r": pc.run_end_encode(pa.array([5, 5, None])),
            "lv": pa.ListViewArray.from_arrays(offsets, sizes, pa.array([7, 8, 9])),
            "u": pa.array([uuid.UUID(int=i).bytes for i in range(3)], pa.uuid()),
        }
    )
    feather.write_feather(table, tmp_path / "v.feather")
    want = table.to_pylist()
    assert [r["lv"] for r in want] == [[8, 9], [7], []]
    assert list(StreamingDataset(str(tmp_path / "v.feather"), shuffle=False)) == want
    ds = StreamingDataset(
        str(tmp_path / "v.feather"),
        shuffle=False,
        batch_size=3,
        columns=["id", "r"],
        fill_nulls={"r": -1},
    )
    ((batch,),) = [list(ds)]
    assert batch["id"].tolist() == [1, 2, 3] and batch["r"].tolist() == [5, 5, -1]
    with warnings.catch_warnings():  # pyarrow deprecated writing version 1
        warnings.simplefilter("ignore", DeprecationWarning)
        feather.write_feather(pa.table({"x": [1, 2]}), tmp_path / "old.feather", version=1)
    got = list(StreamingDataset(str(tmp_path / "old.feather"), shuffle=False))
    assert got == [{"x": 1}, {"x": 2}]  # version 1: tests/test_pyarrow_types.py


def test_damaged_offsets_are_refused_by_name_not_a_crash(tmp_path: Path) -> None:
    """A batch whose string offsets point past its data (the frame intact) is refused
    with the file and the column named; read in a child process, so that a crash fails
    this test rather than the whole run."""
    import subprocess
    import sys

    path = tmp_path / "o.arrow"
    table = pa.table({"s": ["alpha", "beta", "gamma"] * 100})
    with pa.ipc.new_stream(path, table.schema) as w:
        w.write_table(table)
    data = bytearray(path.read_bytes())
    offsets = np.arange(0, 301, dtype=np.int32)  # not the real ones: find the real ones
    real = np.cumsum([0] + [len(v) for v in table.column("s").to_pylist()]).astype(np.int32)
    at = bytes(data).find(real.tobytes())
    assert at > 0 and offsets.size == real.size
    data[at + 4 * 150 : at + 4 * 151] = np.int32(1 << 30).tobytes()
    path.write_bytes(bytes(data))
    code = (
        "from shardstream.loader import StreamingDataset, ShardError\n"
        "try:\n"
        f"    list(StreamingDataset({str(path)!r}, shuffle=False))\n"
        "except ShardError as e:\n"
        "    print('REFUSED', e)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("REFUSED"), run.stdout
    assert str(path) in run.stdout and "column 's'" in run.stdout


def test_a_batch_from_the_wrong_place_is_refused(tmp_path: Path) -> None:
    """The index says where each batch lies; bytes there that are not that batch (the
    file rewritten in place keeping its size and mtime, here) are a named error."""
    import os

    path = tmp_path / "r.arrow"
    _write(path, _table(0, 1000), "file")
    ds = StreamingDataset(str(path), shuffle=False)
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    first = ds.index.shards[0].details["row_group_offsets"][1]
    data[first : first + 8] = bytes(8)
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(
        ShardError, match=r"r.arrow: the bytes read at \d+ are not the record batch"
    ):
        list(ds)
