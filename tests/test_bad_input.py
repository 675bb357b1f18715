"""Bad input gets a clear error naming the shard or the value: never a hang, never silently
fewer records."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from shardstream.loader import ShardError, ShardIndex, StreamingDataset
from shardstream.loader.shard import Shard
from shardstream.loader.storage.filesystems import redact, strip_credentials

from .datagen import parquet_table, tar_bytes, write_dataset

LOCAL = fsspec.filesystem("file")


def test_truncated_parquet_is_named(tmp_path: Path) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[50, 50])
    raw = Path(paths[1]).read_bytes()
    Path(paths[1]).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ShardError, match=r"part-00001.parquet: not a Parquet file.*truncated"):
        ShardIndex.build(str(tmp_path))


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_parquet_data_is_named_even_from_a_worker(tmp_path: Path, workers: int) -> None:
    paths = write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[50, 50])
    d = ShardIndex.build(str(tmp_path)).shards[0].details
    raw = bytearray(Path(paths[0]).read_bytes())
    start, n = d["row_group_offsets"][2], d["row_group_bytes"][2]
    raw[start : start + n] = b"\x17" * n  # garbage pages, same size: the footer still parses
    Path(paths[0]).write_bytes(bytes(raw))
    index = ShardIndex.build(str(tmp_path))  # indexing reads footers only: it succeeds
    ds = StreamingDataset(index, shuffle=False)
    with pytest.raises(ShardError, match=r"part-00000.parquet: cannot read row groups"):
        list(DataLoader(ds, batch_size=None, num_workers=workers))


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda n: n // 2 + 100, "truncated tar"),  # inside a member
        (lambda n: 4 * 1024, "no end-of-archive block"),  # exactly between two members
    ],
)
def test_truncated_tar_never_yields_fewer_records(tmp_path: Path, cut: Any, message: str) -> None:
    data = tar_bytes(0, 8)
    (tmp_path / "a.tar").write_bytes(data[: cut(len(data))])
    with pytest.raises(ShardError, match=rf"a.tar: .*{message}"):
        ShardIndex.build(str(tmp_path))


def test_zero_record_shards_are_valid(tmp_path: Path) -> None:
    pq.write_table(parquet_table(0, 0), tmp_path / "a.parquet")
    pq.write_table(parquet_table(0, 5), tmp_path / "b.parquet")
    assert ShardIndex.build(str(tmp_path)).shard_sizes.tolist() == [0, 5]
    assert len(list(StreamingDataset(str(tmp_path)))) == 5
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "e.tar").write_bytes(empty.getvalue())
    (tmp_path / "t" / "f.tar").write_bytes(tar_bytes(0, 3))
    assert ShardIndex.build(str(tmp_path / "t")).shard_sizes.tolist() == [0, 3]
    all_empty = StreamingDataset(str(tmp_path / "t" / "e.tar"), num_replicas=2, rank=1)
    assert len(all_empty) == 0 and list(all_empty) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0, "rank": 0}, "num_replicas must be >= 1, got 0"),
        ({"num_replicas": 2, "rank": 2}, r"Invalid rank 2, rank should be in the interval \[0, 1"),
        ({"num_replicas": 2, "rank": -1}, "Invalid rank -1"),
        ({"batch_size": -4}, "batch_size must be a positive int or None, got -4"),
        ({"batch_size": 2.5}, "batch_size must be a positive int or None, got 2.5"),
        ({"seed": "x"}, "seed must be an int"),
        ({"batch_size": np.float64(4.0)}, r"batch_size must be a positive int or None, got .*4\.0"),
        ({"prefetch": True}, r"prefetch must be an int >= 0 \(blocks read ahead\), got True"),
        ({"read_threads": 2.0}, r"read_threads must be a positive int or None, got 2\.0"),
        ({"window": np.float32(2)}, r"window must be an int >= 1, got .*2\.0"),
        ({"num_replicas": np.int64(2), "rank": 1.0}, r"rank must be an int, got 1\.0 \(float\)"),
        ({"num_replicas": 2}, r"num_replicas=2 was given without rank.*or run under torchrun"),
    ],
)
def test_invalid_arguments_quote_the_value(
    tmp_path: Path, kwargs: dict, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)  # outside torchrun
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[5])
    with pytest.raises(ValueError, match=message):
        # a rank only a process group could give is asked for where it is first needed
        # (the group may come after the dataset: loader.ranks)
        len(StreamingDataset(str(tmp_path), **kwargs))


def test_numpy_integer_arguments_are_taken_as_ints(tmp_path: Path) -> None:
    write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[9, 0, 14, 6])
    kw = dict(seed=3, num_replicas=2, rank=1, batch_size=4, window=2, read_threads=2)
    kw["memory_budget"] = 1 << 20
    as_numpy = {k: np.int64(v) if k != "rank" else np.int32(v) for k, v in kw.items()}
    plain = StreamingDataset(str(tmp_path), **kw)  # type: ignore[arg-type]
    numpy = StreamingDataset(str(tmp_path), **as_numpy)  # type: ignore[arg-type]
    plain.set_epoch(1)
    numpy.set_epoch(np.int64(1))
    got, want = list(numpy), list(plain)
    assert len(got) == len(want) == len(numpy) == 4  # ceil(29 / 2) = 15 records, batches of 4
    assert all(a["id"].tolist() == b["id"].tolist() for a, b in zip(got, want))
    json.dumps(numpy.state_dict())  # the state holds plain ints


def test_wrong_credentials_get_a_403_naming_the_url(s3_auth_endpoint: str, s3: Any) -> None:
    opts = {
        "client_kwargs": {"endpoint_url": s3_auth_endpoint},
        "key": "AKIAWRONGKEY",
        "secret": "not-the-secret-XYZ",
    }
    with pytest.raises(PermissionError) as info:
        StreamingDataset("s3://private/train/", storage_options=opts)
    message = str(info.value)
    assert "s3://private/train/: access denied" in message
    assert "check the credentials" in message
    assert "not-the-secret-XYZ" not in message


def test_credentials_never_reach_logs_errors_or_saved_indexes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert redact("https://user:pa55@host/x.tar") == "https://***@host/x.tar"
    assert strip_credentials("s3://AKID:s3cret@bucket/k") == "s3://bucket/k"
    shard = Shard("https://user:pa55@host/x.tar", "tar", 1, 10, None, {"keys": [], "members": []})
    with caplog.at_level(logging.DEBUG, logger="shardstream.loader"):
        ShardIndex([shard]).save(str(tmp_path / "i.json"))
        doc = json.loads((tmp_path / "i.json").read_text())
        with pytest.raises(Exception) as info:
            ShardIndex.build(["https://user:pa55@127.0.0.1:1/x.tar"])
    assert doc["shards"][0]["url"] == "https://host/x.tar"
    assert "pa55" not in str(info.value)
    assert all("pa55" not in r.getMessage() for r in caplog.records)
    assert any("left out of the saved index" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_one_column_name_is_one_column_not_its_letters(tmp_path: Path, fmt: str) -> None:
    write_dataset(LOCAL, str(tmp_path), fmt, sizes=[4, 3])
    name = "id" if fmt == "parquet" else "txt"
    ds = StreamingDataset(str(tmp_path), columns=name, shuffle=False)
    assert ds.columns == [name]
    records = list(ds)
    assert len(records) == 7
    assert all(set(r) - {"__key__", "__url__"} == {name} for r in records)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (3, r"columns must be a column name or a list of names, got 3 \(int\)"),
        (b"id", r"columns must be a column name or a list of names, got b'id' \(bytes\)"),
        (["id", 2], r"columns must be names \(str\), got 2 \(int\) in \['id', 2\]"),
    ],
)
def test_columns_that_are_not_names_are_refused(tmp_path: Path, columns: Any, message: str) -> None:
    write_dataset(LOCAL, str(tmp_path), "parquet", sizes=[5])
    with pytest.raises(TypeError, match=message):
        StreamingDataset(str(tmp_path), columns=columns)


def test_schema_mismatch_between_index_and_shard_columns(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match=r"columns \['b'\] are not in the shards.*x.parquet"):
        StreamingDataset(str(tmp_path), columns=["a", "b"])
