"""Types pyarrow reads that other writers put in files: Parquet logical types pyarrow reads
as extension types (duckdb's UUID and JSON columns) and pyarrow's own extension types;
view types (``string_view``, ``binary_view``, ``list_view``) in Parquet and Arrow IPC;
Feather version 1 files. Each is read as pyarrow reads the same file (whole records, every
column), in record and batch mode, shuffled or not, from a fresh index and from a saved
one (Arrow and JSON)."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

from shardstream import ShardError, ShardIndex, StaleIndexError, StreamingDataset


def _rows_of(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch's rows as records: tensor rows as Python values (`tolist`), list items as
    they are."""
    n = len(next(iter(batch.values())))
    cols = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def _every_way(
    source: str,
    want: list[dict[str, Any]],
    tmp: Path,
    batch: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **batch_kw: Any,
) -> None:
    """The dataset over `source` yields `want` (pyarrow's records), whole, in every mode:
    records, batches of 3 (torch's and Arrow's), in storage order and shuffled (compared in
    `id` order), indexed afresh and from an index saved as Arrow and as JSON and loaded.
    `batch`: how a batch row shows a record (for the columns a batch holds otherwise: tensors
    of nulls filled); `batch_kw`: batch mode's options (fill_nulls)."""
    index = ShardIndex.build(source)
    saved = [str(tmp / "i.index.arrow"), str(tmp / "i.json")]
    for path in saved:
        index.save(path)
    for where in [source, *saved]:
        for shuffle in (False, True):
            records = list(StreamingDataset(where, shuffle=shuffle))
            if shuffle:
                records.sort(key=lambda r: r["id"])
            assert records == want, (where, shuffle)
            ds = StreamingDataset(where, shuffle=shuffle, batch_size=3, **batch_kw)
            rows = [r for b in ds for r in _rows_of(b)]
            if shuffle:
                rows.sort(key=lambda r: r["id"])
            assert rows == [batch(r) if batch else r for r in want], (where, shuffle)
            # Arrow batches: pyarrow's rows as they are (nulls too: no fill_nulls)
            ds = StreamingDataset(where, shuffle=shuffle, batch_size=3, batch_format="arrow")
            rows = [r for b in ds for r in b.to_pylist()]
            if shuffle:
                rows.sort(key=lambda r: r["id"])
            assert rows == want, (where, shuffle, "arrow")


# --- 1. extension types -----------------------------------------------------------------


def test_duckdb_uuid_and_json_columns_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """duckdb's UUID columns (at the top, in a list, in a struct) and JSON columns: pyarrow's
    Parquet reader gives them as `arrow.uuid` and `arrow.json` (its Parquet footer's
    schema, `to_arrow_schema`, as their storage types). The index records what a read
    gives, so records hold `uuid.UUID`s as pyarrow's `to_pylist` does, and so do batches
    (a list column: a UUID is no number)."""
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "d" / "u.parquet"
    path.parent.mkdir()
    duckdb.sql(
        "COPY (SELECT i AS id, uuid() AS u, "
        "CASE WHEN i % 3 = 1 THEN NULL ELSE uuid() END AS maybe_u, "
        "('{\"n\": ' || i || '}')::JSON AS j, [uuid(), NULL] AS us, {'k': uuid()} AS s, "
        "'row ' || i AS name "
        f"FROM range(10) t(i) ORDER BY i) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 4)"
    )
    read = pq.read_table(path)
    assert isinstance(read.schema.field("u").type, pa.UuidType)
    want = read.to_pylist()
    assert isinstance(want[0]["u"], uuid.UUID) and want[1]["maybe_u"] is None
    ds = StreamingDataset(str(path.parent))
    assert ds.index.columns_schema(None).field("u").type == pa.uuid()
    _every_way(str(path.parent), want, tmp_path)
    (first,) = list(StreamingDataset(str(path), shuffle=False, batch_size=10))
    assert isinstance(first["id"], torch.Tensor)
    assert first["u"] == [r["u"] for r in want] and isinstance(first["u"][0], uuid.UUID)


def test_pyarrow_extension_types_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """pyarrow's canonical extension types, written with the Arrow schema in the file
    (its default) and without it (only the Parquet logical types: UUID and JSON are
    extension types again when read): as pyarrow reads each file."""
    n = 7
    ids = pa.array(range(n))
    storage = {
        "u": (
            pa.uuid(),
            pa.array([uuid.UUID(int=i * 7919).bytes for i in range(n)], pa.binary(16)),
        ),
        "j": (pa.json_(), pa.array(['{"a": 1}', "[1, 2]", None, '"x"', "3", "null", "{}"])),
        "t": (
            pa.fixed_shape_tensor(pa.float32(), [2, 2]),
            pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32(), 4)),
        ),
        "o": (
            pa.opaque(pa.binary(), "geometry", "postgis"),
            pa.array([b"a", b"b", None, b"c", b"d", b"e", b"f"]),
        ),
        "b8": (pa.bool8(), pa.array([1, 0, 1, 0, 2, 0, 1], pa.int8())),
    }
    cols = {k: pa.ExtensionArray.from_storage(t, s) for k, (t, s) in storage.items()}
    table = pa.table({"id": ids, **cols})
    for store_schema in (True, False):
        folder = tmp_path / f"store-{store_schema}"
        folder.mkdir()
        pq.write_table(table, folder / "e.parquet", row_group_size=3, store_schema=store_schema)
        read = pq.read_table(folder / "e.parquet")
        if not store_schema:  # the logical types alone
            assert read.schema.field("u").type == pa.uuid()
            assert read.schema.field("j").type == pa.json_()
        want = read.to_pylist()
        tensor = isinstance(read.schema.field("t").type, pa.FixedShapeTensorType)

        def batch(r: dict[str, Any], tensor: bool = tensor) -> dict[str, Any]:
            # a fixed_shape_tensor is a tensor of its shape in a batch, a flat list in a record
            t = r["t"]
            return {**r, "t": [t[0:2], t[2:4]]} if tensor and t is not None else r

        _every_way(str(folder), want, folder, batch)


def test_extension_types_in_arrow_ipc_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array(range(5)),
            "u": pa.array([uuid.UUID(int=i).bytes for i in range(5)], pa.uuid()),
            "j": pa.array(['{"a": 1}', None, "2", "[]", "{}"], pa.json_()),
            "j_view": pa.ExtensionArray.from_storage(
                pa.json_(pa.string_view()), pa.array(["1", None, "2", "3", "4"], pa.string_view())
            ),
        }
    )
    with pa.ipc.new_file(tmp_path / "e.arrow", table.schema) as w:
        w.write_table(table, max_chunksize=2)
    want = pa.ipc.open_file(tmp_path / "e.arrow").read_all().to_pylist()
    _every_way(str(tmp_path / "e.arrow"), want, tmp_path)


# --- 2. view types ----------------------------------------------------------------------


def _views(n: int, lo: int = 0) -> pa.Table:
    """Every view type at the top and nested, with nulls: rows lo..lo + n."""
    at = range(lo, lo + n)
    ints = [[i, i + 1] for i in at]
    words = [["w"] * (i % 3) if i % 4 != 3 else None for i in at]
    return pa.table(
        {
            "id": pa.array(at),
            "s": pa.array([f"s{i}" * (i % 5) if i % 4 else None for i in at], pa.string_view()),
            "b": pa.array([bytes([i]) * (i % 20) if i % 3 else None for i in at], pa.binary_view()),
            "pair": pa.array(ints, pa.list_view(pa.int64())),
            "big_pair": pa.array(ints, pa.large_list_view(pa.int32())),
            "words": pa.array(words, pa.list_view(pa.string_view())),
            "in_list": pa.array(words, pa.list_(pa.string_view())),
            "in_struct": pa.array(
                [{"x": f"x{i}", "y": None} for i in at],
                pa.struct([("x", pa.string_view()), ("y", pa.binary_view())]),
            ),
            "in_map": pa.array(
                [[("k", f"v{i}")] for i in at], pa.map_(pa.string_view(), pa.string_view())
            ),
        }
    )


@pytest.mark.parametrize("kind", ["parquet", "parquet-one-group", "arrow", "stream"])
def test_view_types_read_as_pyarrow_reads_them(tmp_path: Path, kind: str) -> None:
    """View columns (pyarrow writes them to Parquet with its Arrow schema, which pyarrow
    reads back as views) read in every mode: batches gather their values as the plain
    types (`take` has no view kernels); a list view of numbers of one length is a tensor
    column as a list of them is."""
    table = _views(40)
    parquet = kind.startswith("parquet")
    path = tmp_path / "d" / f"v.{'parquet' if parquet else 'arrow'}"
    path.parent.mkdir()
    if parquet:
        if kind == "parquet":  # pyarrow 26 writes a struct of views in one row group only
            table = table.drop_columns(["in_struct"])
        pq.write_table(table, path, row_group_size=7 if kind == "parquet" else None)
        read = pq.read_table(path)
        assert read.schema.field("s").type == pa.string_view()
        assert read.schema.field("pair").type == pa.list_view(pa.int64())
    else:
        new = pa.ipc.new_file if kind == "arrow" else pa.ipc.new_stream
        with new(path, table.schema) as w:
            w.write_table(table, max_chunksize=7)
        read = feather.read_table(path) if kind == "arrow" else pa.ipc.open_stream(path).read_all()
    want = read.to_pylist()
    _every_way(str(path.parent), want, tmp_path)
    (batch,) = list(StreamingDataset(str(path), shuffle=False, batch_size=40))
    assert isinstance(batch["pair"], torch.Tensor) and batch["pair"].shape == (40, 2)
    assert isinstance(batch["s"], list)


def test_polars_views_read_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """polars writes Arrow IPC with views (its own layout); its Parquet as plain types."""
    pl = pytest.importorskip("polars")
    df = pl.DataFrame(
        {
            "id": list(range(30)),
            "s": [f"v{i}" if i % 4 else None for i in range(30)],
            "b": [bytes([i]) * i for i in range(30)],
            "ws": [["a", "bc"][: i % 3] for i in range(30)],
        }
    )
    df.write_ipc(tmp_path / "p.arrow")
    df.write_parquet(tmp_path / "p.parquet", row_group_size=8)
    assert feather.read_table(tmp_path / "p.arrow").schema.field("s").type == pa.string_view()
    for name in ("p.arrow", "p.parquet"):
        reader = feather.read_table if name.endswith(".arrow") else pq.read_table
        want = reader(tmp_path / name).to_pylist()
        _every_way(str(tmp_path / name), want, tmp_path)


def test_a_parquet_mix_of_view_and_plain_shards_reads_as_one_dataset(tmp_path: Path) -> None:
    """A view shard first decides nothing: the dataset's types are the plain ones, so a
    shard of plain strings beside it reads, in batches too."""
    (tmp_path / "d").mkdir()
    a, b = _views(10), _views(10, 10)
    pq.write_table(a, tmp_path / "d" / "a.parquet")
    plain = {"s": pa.string(), "b": pa.large_binary(), "in_list": pa.list_(pa.large_string())}
    b = pa.table({c: b[c].cast(plain[c]) if c in plain else b[c] for c in b.column_names})
    pq.write_table(b, tmp_path / "d" / "b.parquet")
    want = pq.read_table(tmp_path / "d" / "a.parquet").to_pylist()
    want += pq.read_table(tmp_path / "d" / "b.parquet").to_pylist()
    ds = StreamingDataset(str(tmp_path / "d"))
    assert ds.index.columns_schema(None).field("s").type == pa.string()
    _every_way(str(tmp_path / "d"), want, tmp_path)


class _Labels(pa.ExtensionType):
    """An extension type of the user's over a view type: one shardstream cannot rebuild."""

    def __init__(self) -> None:
        super().__init__(pa.string_view(), "shardstream.test.labels")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _Labels:
        return cls()


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_an_extension_type_over_views_reads_as_records_and_is_named_in_batches(
    tmp_path: Path, kind: str
) -> None:
    """Records as pyarrow gives them; a batch cannot gather it (pyarrow has no kernel):
    a ShardError naming the column, its type and the shard, not pyarrow's bare error."""
    labels = pa.ExtensionArray.from_storage(_Labels(), pa.array(["a", None, "b"], pa.string_view()))
    table = pa.table({"id": [0, 1, 2], "label": labels})
    path = tmp_path / f"l.{kind}"
    pa.register_extension_type(_Labels())
    try:
        if kind == "parquet":
            pq.write_table(table, path)
            want = pq.read_table(path).to_pylist()
        else:
            with pa.ipc.new_file(path, table.schema) as w:
                w.write_table(table)
            want = pa.ipc.open_file(path).read_all().to_pylist()
        assert list(StreamingDataset(str(path), shuffle=False)) == want
        with pytest.raises(
            ShardError, match=rf"l\.{kind}: column 'label' is extension<shardstream\.test\.labels"
        ):
            list(StreamingDataset(str(path), batch_size=2))
        (batch,) = list(StreamingDataset(str(path), shuffle=False, batch_size=3, columns=["id"]))
        assert batch["id"].tolist() == [0, 1, 2]
    finally:
        pa.unregister_extension_type("shardstream.test.labels")


# --- 3. Feather version 1 ---------------------------------------------------------------


def _write_v1(table: pa.Table, path: Path) -> None:
    with warnings.catch_warnings():  # pyarrow deprecated writing version 1
        warnings.simplefilter("ignore", DeprecationWarning)
        feather.write_feather(table, path, version=1)


def _v1_table(lo: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(lo, lo + n)),
            "f": pa.array([i / 2 if i % 5 else None for i in range(lo, lo + n)], pa.float64()),
            "label": pa.array([i % 7 for i in range(lo, lo + n)], pa.int32()),
            "name": pa.array([f"n{i}" if i % 6 else None for i in range(lo, lo + n)], pa.string()),
            "raw": pa.array([bytes([i % 256]) * (i % 4) for i in range(lo, lo + n)]),
            "flag": pa.array([i % 2 == 0 for i in range(lo, lo + n)]),
            "cat": pa.array(
                [["x", "y", "z"][i % 3] for i in range(lo, lo + n)]
            ).dictionary_encode(),
            "when": pa.array(list(range(lo, lo + n)), pa.timestamp("ms")),
        }
    )


def _filled(r: dict[str, Any]) -> dict[str, Any]:
    """A record as a batch row shows it: the float column's nulls filled."""
    return {**r, "f": -1.0 if r["f"] is None else r["f"]}


def test_feather_version_1_reads_as_pyarrow_feather_reads_it(tmp_path: Path) -> None:
    """Feather version 1 files (read whole: they have no batches to read by range) read as
    `pyarrow.feather.read_table` reads them, beside Feather v2 and Parquet shards."""
    folder = tmp_path / "d"
    folder.mkdir()
    _write_v1(_v1_table(0, 25), folder / "a.feather")
    _write_v1(_v1_table(25, 1), folder / "b.feather")
    feather.write_feather(_v1_table(26, 9), folder / "c.feather")  # version 2
    want: list[dict[str, Any]] = []
    with warnings.catch_warnings():  # pyarrow deprecated version 1 files
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in ("a", "b", "c"):
            want += feather.read_table(folder / f"{name}.feather").to_pylist()
    assert len(want) == 35
    _every_way(str(folder), want, tmp_path, _filled, fill_nulls={"f": -1.0})
    got = list(StreamingDataset(str(folder), shuffle=False, columns=["name", "id"]))
    assert got == [{"name": r["name"], "id": r["id"]} for r in want]
    one = ShardIndex.build(str(folder / "a.feather"))
    assert one.num_records == 25 and one.shards[0].details["ipc"] == "feather1"


def test_feather_version_1_split_over_ranks_and_workers(tmp_path: Path) -> None:
    """Ranks and DataLoader workers each read their share of one version 1 file."""
    _write_v1(_v1_table(0, 40), tmp_path / "a.feather")
    seen = []
    for rank in range(3):
        ds = StreamingDataset(
            str(tmp_path / "a.feather"), num_replicas=3, rank=rank, drop_last=True, seed=1
        )
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        seen += [r["id"] for r in loader]
    assert len(seen) == len(set(seen)) == 39


def test_a_changed_feather_version_1_file_is_named(tmp_path: Path) -> None:
    """A version 1 file rewritten after indexing is a StaleIndexError naming it, never
    other rows."""
    path = tmp_path / "a.feather"
    _write_v1(_v1_table(0, 30), path)
    ds = StreamingDataset(str(path), shuffle=False)
    stat = os.stat(path)
    _write_v1(_v1_table(100, 30), path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(StaleIndexError, match=r"a\.feather"):
        list(ds)


_SWEEP = """
import sys
from pathlib import Path
from shardstream import ShardError, StreamingDataset
for path in sorted(Path(sys.argv[1]).iterdir()):
    for batch_size in (None, 2):
        try:
            list(StreamingDataset(str(path), shuffle=False, batch_size=batch_size))
            print("READ", path.name)
        except ShardError as e:
            print("REFUSED", path.name, "named" if path.name in str(e) else "unnamed", e)
        except Exception as e:
            print("BARE", path.name, type(e).__name__, e)
"""


def test_damaged_feather_version_1_files_are_refused_by_name_never_a_crash(
    tmp_path: Path,
) -> None:
    """pyarrow reads a version 1 file's metadata without verifying it (its own reader
    crashes the process on 265 of these 1,008 damaged files, pyarrow 26): each byte of the
    metadata set to 0xFF and to 0x7F, and files cut short, are read or refused by a
    ShardError naming the file. In a child process: a crash fails this test, not the
    run."""
    import struct
    import subprocess
    import sys

    table = pa.table(
        {
            "c": pa.array(["x", "y", "x", None]).dictionary_encode(),
            "s": ["a", None, "ccc", ""],
            "t": pa.array([1, 2, 3, 4], pa.time32("ms")),
            "when": pa.array([1, None, 3, 4], pa.timestamp("us", "UTC")),
        }
    )
    _write_v1(table, tmp_path / "base.feather")
    whole = (tmp_path / "base.feather").read_bytes()
    meta = struct.unpack_from("<I", whole, len(whole) - 8)[0]
    files = tmp_path / "damaged"
    files.mkdir()
    for at in range(len(whole) - 8 - meta, len(whole) - 8):
        for value in (0xFF, 0x7F):
            damaged = bytearray(whole)
            damaged[at] = value
            (files / f"m{at:05d}-{value}.feather").write_bytes(bytes(damaged))
    for cut in (12, len(whole) // 2, len(whole) - 9):
        (files / f"cut{cut:05d}.feather").write_bytes(whole[:cut] + whole[-4:])
    run = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(files)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parent.parent,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    outcomes = [line.split(" ", 3) for line in run.stdout.splitlines()]
    assert len(outcomes) == 2 * len(list(files.iterdir()))
    assert not [o for o in outcomes if o[0] == "BARE"]
    assert not [o for o in outcomes if o[0] == "REFUSED" and o[2] != "named"]
    assert {o[0] for o in outcomes} == {"READ", "REFUSED"}
    assert all(o[0] == "REFUSED" for o in outcomes if o[1].startswith("cut"))


# --- 4. nulls in a bool column ----------------------------------------------------------


def test_a_null_in_a_bool_column_asks_for_fill_nulls_for_a_boolean_tensor(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2, 3], "ok": [True, None, False]}), tmp_path / "b.parquet")
    with pytest.raises(
        ShardError,
        match=r"b\.parquet: column 'ok' \(bool\) holds 1 null\(s\), which a boolean tensor "
        r"cannot; pass fill_nulls=\{'ok': <value>\}",
    ):
        list(StreamingDataset(str(tmp_path), batch_size=2))
    (batch,) = list(StreamingDataset(str(tmp_path), batch_size=3, fill_nulls={"ok": True}))
    assert batch["ok"].dtype == torch.bool and sorted(batch["ok"].tolist()) == [False, True, True]
    pq.write_table(pa.table({"n": pa.array([1, None], pa.int8())}), tmp_path / "b.parquet")
    with pytest.raises(ShardError, match=r"which an integer tensor cannot"):
        list(StreamingDataset(str(tmp_path), batch_size=2))
