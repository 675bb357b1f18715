"""Arrow IPC shards (file format, stream format, Feather v2, HF datasets' save_to_disk):
records, batches, columns, resume, S3 and mixtures, as pyarrow reads the same files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from loader import MixtureDataset, ShardError, ShardIndex, Stream, StreamingDataset
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


def test_truncated_stream_and_dictionaries_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    _write(path, _table(0, 1000), "stream")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ShardError, match=r"t.arrow: not a readable Arrow IPC file"):
        StreamingDataset(str(path))
    d = pa.table({"c": pa.array(["a", "b", "a"]).dictionary_encode()})
    _write(tmp_path / "dict.arrow", d, "file")
    with pytest.raises(ShardError, match=r"dict.arrow: dictionary-encoded columns"):
        StreamingDataset(str(tmp_path / "dict.arrow"))


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
