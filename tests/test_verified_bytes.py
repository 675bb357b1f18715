"""Every byte decoded is the byte asked for (issue: verified bytes): a storage that lies
(short, long, shifted or zero-filled ranges) ends in a ShardError naming the shard; the
cases other tools' files showed, each refused by name or read right."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from shardstream.loader import MixtureDataset, RetryPolicy, ShardError, Stream, StreamingDataset
from shardstream.loader.storage.ranged_get import RangeIgnoredError
from shardstream.loader.storage.ranges import PartsFile
from tests.corpora import unpack
from tests.httpd import http_server

QUICK = RetryPolicy(max_attempts=2, base_delay=0.0, deadline=None)


class LiarFileSystem(AbstractFileSystem):
    """Local files whose ranged reads lie once `lie` is set: "short" (half the bytes),
    "long" (one byte more), "shifted" (the bytes one further on), "zeros" (the right
    length, all zero: what an fsspec byte cache gives for bytes it never fetched)."""

    protocol = "liar"
    lie: ClassVar[str | None] = None
    local = LocalFileSystem()

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(path).removeprefix("liar://")

    def info(self, path: str, **kw: Any) -> dict[str, Any]:
        return self.local.info(self._strip_protocol(path))

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        return self.local.ls(self._strip_protocol(path), detail=detail)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        size = os.path.getsize(path)
        start = 0 if start is None else start
        end = size if end is None else end
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
            if self.lie == "short":
                return data[: len(data) // 2]
            if self.lie == "long":
                return data + b"\x01"
            if self.lie == "shifted":
                f.seek(start + 1)
                return (f.read(end - start) + b"\x00")[: end - start]
            if self.lie == "zeros":
                return bytes(len(data))
        return data


fsspec.register_implementation("liar", LiarFileSystem, clobber=True)


def _parquet(path: Path, n: int = 400) -> None:
    table = pa.table({"x": np.arange(n), "s": [f"value {i}" * 3 for i in range(n)]})
    pq.write_table(table, path, row_group_size=100)


def _tar(path: Path, n: int = 20) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(n):
            for ext, data in (("cls", str(i).encode()), ("txt", f"text {i}".encode() * 20)):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("lie", ["short", "long", "shifted", "zeros"])
@pytest.mark.parametrize("kind", ["parquet", "tar"])
def test_a_lying_storage_ends_in_a_named_error(tmp_path: Path, kind: str, lie: str) -> None:
    path = tmp_path / f"shard.{kind}"
    (_parquet if kind == "parquet" else _tar)(path)
    ds = StreamingDataset(f"liar://{path}", shuffle=False, retry=QUICK)  # indexed honestly
    assert len(list(ds)) == (400 if kind == "parquet" else 20)
    LiarFileSystem.lie = lie
    try:
        with pytest.raises(ShardError, match=str(path)):
            list(ds)
    finally:
        LiarFileSystem.lie = None


def test_parts_file_fetches_what_was_not_fetched_never_zeros() -> None:
    data = bytes(range(256)) * 4
    asked = []

    def fetch(a: int, b: int) -> bytes:
        asked.append((a, b))
        return data[a:b]

    f = PartsFile("s3://b/k", len(data), {(0, 100): data[:100], (200, 300): data[200:300]}, fetch)
    f.seek(50)
    assert f.read(200) == data[50:250]  # the gap [100, 200) fetched, not zero-filled
    f.seek(280)
    assert f.read(100) == data[280:380]
    assert asked == [(100, 200), (300, 380)]
    with pytest.raises(ValueError, match="s3://b/k"):
        PartsFile("s3://b/k", len(data), {(0, 10): b"short"}, fetch)


def test_legacy_parquet_mr_without_a_version_reads_right_over_s3(s3: Any) -> None:
    """nation.dict-malformed.parquet (created_by "parquet-mr", no version): its chunk
    lengths leave out the dictionary page header (PARQUET-816). Over S3 it read 17 of 25
    rows wrong: the bytes past our ranges came back as zeros."""
    path = Path(__file__).parent / "data" / "corpora" / "parquet" / "nation.dict-malformed.parquet"
    fs = s3.fs()
    fs.mkdir("legacy")
    fs.pipe("legacy/nation.parquet", path.read_bytes())
    ds = StreamingDataset(
        "s3://legacy/nation.parquet", storage_options=s3.storage_options, shuffle=False
    )
    assert list(ds) == pq.read_table(path).to_pylist()


def test_http_without_range_support_is_refused_by_name(tmp_path: Path) -> None:
    _tar(tmp_path / "a.tar", n=400)  # larger than one read: a ranged read is needed
    _parquet(tmp_path / "b.parquet", n=20_000)
    with http_server(tmp_path, ranges=False) as url:
        for name in ("a.tar", "b.parquet"):
            with pytest.raises(RangeIgnoredError, match=rf"{url}/{name}: .*ignores Range"):
                list(StreamingDataset(f"{url}/{name}", shuffle=False))
    with http_server(tmp_path, ranges=True) as url:
        got = list(StreamingDataset(f"{url}/a.tar", shuffle=False))
        assert [r["cls"] for r in got] == [str(i).encode() for i in range(400)]
        rows = list(StreamingDataset(f"{url}/b.parquet", shuffle=False))
        assert rows == pq.read_table(tmp_path / "b.parquet").to_pylist()


def test_http_folder_lists_with_sizes_and_splits_over_ranks(tmp_path: Path) -> None:
    for k in range(4):
        pq.write_table(pa.table({"x": np.arange(k * 10, k * 10 + 10)}), tmp_path / f"p{k}.parquet")
    with http_server(tmp_path, ranges=True) as url:
        seen = []
        for rank in range(2):
            ds = StreamingDataset(f"{url}/", num_replicas=2, rank=rank, seed=3)
            seen += [r["x"] for r in ds]
            assert all(s.url.startswith(url) for s in ds.index.shards)
        assert sorted(seen) == list(range(40))
        # DataLoader workers open their own HTTP session (fsspec's is per process)
        ds = StreamingDataset(f"{url}/", batch_size=8, seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        assert sorted(x for b in loader for x in b["x"].tolist()) == list(range(40))
    with http_server(tmp_path, ranges=True) as url, pytest.raises(FileNotFoundError) as e:
        StreamingDataset(f"{url}/missing/")
    assert f"{url}/missing" in str(e.value)


def test_row_count_comes_from_the_row_groups(tmp_path: Path) -> None:
    """repeated_no_annotation.parquet (parquet-rs 0.3): the footer says 0 rows, its row
    group holds 6; pyarrow reads 6."""
    corpus = unpack(tmp_path)
    path = corpus["parquet/repeated_no_annotation.parquet"]
    assert pq.read_metadata(path).num_rows == 0
    assert list(StreamingDataset(str(path), shuffle=False)) == pq.read_table(path).to_pylist()


def test_a_value_python_cannot_hold_names_shard_column_and_row(tmp_path: Path) -> None:
    corpus = unpack(tmp_path)
    path = corpus["parquet/nested_structs.rust.parquet"]
    for batch in (None, 4):
        with pytest.raises(ShardError, match=r"nested_structs.rust.parquet: column '\w+', row 0"):
            list(StreamingDataset(str(path), shuffle=False, batch_size=batch))
    # a date beyond year 9999 in our own file, at row 5
    dates = pa.array([0, 1, 2, 3, 4, 3_000_000, 6], type=pa.date32())
    pq.write_table(pa.table({"d": dates}), tmp_path / "d.parquet")
    with pytest.raises(ShardError, match=r"d.parquet: column 'd', row 5 of the shard"):
        list(StreamingDataset(str(tmp_path / "d.parquet"), shuffle=False))


def test_encrypted_files_are_refused_by_name_and_never_abort(tmp_path: Path) -> None:
    """Columns encrypted under a plaintext footer made pyarrow terminate the process in
    our footer parse; run in a child process, so an abort fails the test instead of
    killing pytest."""
    corpus = unpack(tmp_path)
    code = (
        "import sys\nfrom loader import ShardError, StreamingDataset\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        StreamingDataset(path)\n"
        "    except ShardError as e:\n        print(e)\n"
    )
    plain = corpus["encrypted/encrypt_columns_plaintext_footer.parquet"]
    footer = corpus["encrypted/uniform_encryption.parquet"]
    out = subprocess.run(
        [sys.executable, "-c", code, str(plain), str(footer)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    assert str(plain) in lines[0] and "columns encrypted under a plaintext footer" in lines[0]
    assert str(footer) in lines[1] and "encrypted footer, magic PARE" in lines[1]


def test_no_shards_found_names_the_files_found(tmp_path: Path) -> None:
    """It named none of them, and the warning listing skipped files came after the error
    (so it never appeared)."""
    (tmp_path / "train.csv").write_text("x\n1\n")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError) as e:
        StreamingDataset(str(tmp_path))
    message = str(e.value)
    assert "no shards found" in message and "train.csv" in message and "notes.txt" in message
    assert "convert them to Parquet" in message


def _gnu_sparse_tar(path: Path, fmt: str) -> None:
    src = path.parent / "holes.bin"
    with open(src, "wb") as f:
        f.write(b"start")
        f.seek(1 << 20)
        f.write(b"end")
    subprocess.run(
        [
            "tar",
            "--sparse",
            f"--format={fmt}",
            "-cf",
            str(path),
            "-C",
            str(path.parent),
            "holes.bin",
        ],
        check=True,
    )


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_gnu_sparse_members_are_refused(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "sparse.tar"
    _gnu_sparse_tar(path, fmt)
    with tarfile.open(path) as tf:  # tarfile gives the file's bytes, holes included
        assert tf.getmembers()[0].sparse is not None
    with pytest.raises(ShardError, match=r"sparse.tar: member .*holes.bin is a GNU sparse file"):
        StreamingDataset(str(path))


def test_a_sample_split_across_the_tar_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "split.tar"
    with tarfile.open(path, "w") as tf:
        for name in ("a.jpg", "b.jpg", "a.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ShardError, match=r"split.tar: sample 'a' is split"):
        StreamingDataset(str(path))


def test_a_list_naming_a_file_twice_is_refused(tmp_path: Path) -> None:
    _parquet(tmp_path / "a.parquet")
    a = str(tmp_path / "a.parquet")
    for twice in ([a, a], [a, str(tmp_path / "." / "a.parquet")]):
        with pytest.raises(ValueError, match=r"a.parquet: named twice in the source list"):
            StreamingDataset(twice)


def test_a_stream_column_named_like_the_mixture_s_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2], "__stream__": ["mine", "mine"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [3, 4], "__stream__": ["b", "b"]}), tmp_path / "b.parquet")
    streams = [Stream(str(tmp_path / "a.parquet")), Stream(str(tmp_path / "b.parquet"))]
    with pytest.raises(ValueError, match="has a column named '__stream__'"):
        MixtureDataset(streams)
    ok = MixtureDataset(streams, columns=["x"])  # left out: fine
    assert sorted(r["x"] for r in ok) == [1, 2, 3, 4]


def test_a_hive_key_the_file_contradicts_is_refused(tmp_path: Path) -> None:
    for year, inside in ((2020, 2020), (2021, 1999)):
        folder = tmp_path / f"year={year}"
        folder.mkdir()
        pq.write_table(pa.table({"x": [1, 2], "year": [inside, inside]}), folder / "p.parquet")
    with pytest.raises(ShardError, match=r"year=2021/p.parquet: Hive key 'year' is '2021'"):
        list(StreamingDataset(str(tmp_path), shuffle=False))
    (tmp_path / "year=2021" / "p.parquet").unlink()
    pq.write_table(pa.table({"x": [3], "year": [2021]}), tmp_path / "year=2021" / "p.parquet")
    got = list(StreamingDataset(str(tmp_path), shuffle=False))
    assert sorted((r["year"], r["x"]) for r in got) == [(2020, 1), (2020, 2), (2021, 3)]


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_shard_cannot_run_code_unless_pickles_are_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.tar"
    weights = io.BytesIO()
    torch.save({"w": torch.arange(3)}, weights)
    members = {
        "s0.pyd": pickle.dumps(_Boom()),
        "s1.pth": weights.getvalue(),
        "s2.npy": _npy(np.arange(4)),
    }
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = StreamingDataset(str(path), decode=True, shuffle=False, columns=["pyd"])
    with pytest.raises(
        ShardError, match=r"evil.tar: cannot decode field 'pyd' of sample 's0'.*allow_pickle=True"
    ):
        list(ds)
    assert not (tmp_path / "pwned").exists()
    safe = list(StreamingDataset(str(path), decode=True, shuffle=False, columns=["pth", "npy"]))
    assert safe[1]["pth"]["w"].tolist() == [0, 1, 2]  # weights_only=True loads tensors
    assert safe[2]["npy"].tolist() == [0, 1, 2, 3]
    trusted = StreamingDataset(str(path), decode=True, allow_pickle=True, columns=["pyd"])
    list(trusted)
    assert (tmp_path / "pwned").exists()  # what the opt-in allows


def _npy(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, a)
    return out.getvalue()
