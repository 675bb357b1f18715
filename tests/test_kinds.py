"""A batch column's kind is decided once per dataset: nulls, ragged lists, unsigned and
tensor-typed columns never switch a tensor column to a list between batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from shardstream.loader import ShardError, StreamingDataset


def batches(source: Any, **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("shuffle", False)
    kw.setdefault("batch_size", 4)
    return list(StreamingDataset(source, **kw))


def write(path: Path, columns: dict[str, Any]) -> None:
    pq.write_table(pa.table(columns), path)


def test_float_nulls_become_nan_and_the_column_stays_a_tensor(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", {"id": range(12), "v": [1.0, None] + [2.0] * 10})
    got = batches(str(tmp_path))
    assert all(isinstance(b["v"], torch.Tensor) for b in got)
    assert torch.isnan(got[0]["v"][1]) and got[0]["v"][0] == 1.0


def test_integer_nulls_are_named_or_filled(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"id": range(8), "label": pd.array([1, None, 3, 4, 5, 6, 7, 8], "Int64")})
    df.to_parquet(tmp_path / "a.parquet")
    with pytest.raises(
        ShardError,
        match=r"a.parquet: column 'label' \(int64\) holds 1 null.*"
        r"fill_nulls=\{'label': <value>\}",
    ):
        batches(str(tmp_path))
    got = batches(str(tmp_path), fill_nulls={"label": -1})
    assert torch.cat([b["label"] for b in got]).tolist() == [1, -1, 3, 4, 5, 6, 7, 8]
    # records keep the null, as pyarrow's to_pylist gives it
    assert [r["label"] for r in StreamingDataset(str(tmp_path), shuffle=False)][1] is None
    with pytest.raises(ValueError, match=r"fill_nulls names columns \['nope'\]"):
        batches(str(tmp_path), fill_nulls={"nope": 0})


def test_token_lists_of_two_lengths_are_an_error_or_padded(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", {"id": range(8), "tok": [list(range(128))] * 8})
    write(tmp_path / "b.parquet", {"id": range(8, 16), "tok": [list(range(256))] * 8})
    with pytest.raises(
        ShardError,
        match=r"b.parquet: column 'tok' has rows of length "
        r"256..256.*first rows this process read had 128.*pad=",
    ):
        batches(str(tmp_path))
    got = batches(str(tmp_path), pad={"tok": -1}, batch_size=6)
    assert all(isinstance(b["tok"], torch.Tensor) for b in got)
    assert [tuple(b["tok"].shape) for b in got] == [(6, 128), (6, 256), (4, 256)]
    assert (got[1]["tok"][0, 128:] == -1).all() and (got[1]["tok"][-1, 128:] != -1).all()
    assert got[0]["tok"].dtype == torch.int64


def test_ragged_rows_inside_one_shard_are_named(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", {"tok": [[1, 2], [3], [4, 5]]})
    with pytest.raises(ShardError, match=r"a.parquet: column 'tok' has rows of length 1..2"):
        batches(str(tmp_path))
    got = batches(str(tmp_path), pad={"tok": 0})
    assert got[0]["tok"].tolist() == [[1, 2], [3, 0], [4, 5]]


@pytest.mark.parametrize(
    ("arrow", "torch_dtype"),
    [
        (pa.uint8(), torch.int32),
        (pa.uint16(), torch.int32),
        (pa.uint32(), torch.int64),
        (pa.uint64(), torch.int64),
    ],
)
def test_unsigned_ids_work_with_embedding_and_arithmetic(
    tmp_path: Path, arrow: pa.DataType, torch_dtype: torch.dtype
) -> None:
    ids = pa.array([0, 5, 9, 250], type=arrow)
    lists = pa.array([[1, 2], [3, 4], [5, 6], [7, 8]], type=pa.list_(arrow))
    write(tmp_path / "a.parquet", {"ids": ids, "tok": lists})
    (b,) = batches(str(tmp_path))
    assert b["ids"].dtype == torch_dtype and b["tok"].dtype == torch_dtype
    assert (b["ids"] + 1).tolist() == [1, 6, 10, 251]
    emb = torch.nn.Embedding(300, 2)
    assert emb(b["ids"]).shape == (4, 2) and emb(b["tok"]).shape == (4, 2, 2)


def test_uint64_beyond_int64_is_named(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", {"x": pa.array([1, 2**63 + 5], pa.uint64())})
    with pytest.raises(ShardError, match=r"a.parquet: column 'x' \(uint64\) does not fit int64"):
        batches(str(tmp_path))


def test_fixed_shape_tensors_and_nested_fixed_lists_keep_their_shape(tmp_path: Path) -> None:
    n = 6
    values = np.arange(n * 12, dtype=np.float32)
    tensor_type = pa.fixed_shape_tensor(pa.float32(), (3, 4))
    storage = pa.FixedSizeListArray.from_arrays(pa.array(values), 12)
    tensors = pa.ExtensionArray.from_storage(tensor_type, storage)
    nested = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.int16)), 3), 2
    )
    pq.write_table(pa.table({"t": tensors, "n": nested}), tmp_path / "a.parquet")
    got = batches(str(tmp_path), batch_size=4)
    assert got[0]["t"].shape == (4, 3, 4) and got[1]["t"].shape == (2, 3, 4)
    assert torch.equal(got[0]["t"][1], torch.arange(12, 24, dtype=torch.float32).view(3, 4))
    assert got[0]["n"].shape == (4, 2, 3) and got[0]["n"][1].tolist() == [[6, 7, 8], [9, 10, 11]]


@pytest.mark.parametrize("workers", [0, 2])
def test_kinds_never_switch_between_batches(tmp_path: Path, workers: int) -> None:
    # one float null in the 3rd batch, every other batch full: before, that batch alone
    # came out as a list
    values = [float(i) for i in range(40)]
    values[9] = None  # type: ignore[call-overload]
    write(tmp_path / "a.parquet", {"id": range(40), "v": values, "s": [str(i) for i in range(40)]})
    ds = StreamingDataset(str(tmp_path), batch_size=4, shuffle=False)
    got = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(got) == 10
    assert all(isinstance(b["v"], torch.Tensor) and isinstance(b["s"], list) for b in got)
    assert all(isinstance(b["id"], torch.Tensor) for b in got)


@pytest.mark.parametrize(
    "kind", [pa.list_(pa.int32()), pa.large_list(pa.int32()), pa.list_(pa.int32(), 3)]
)
def test_a_tensor_view_of_a_sliced_list_array_holds_its_own_rows(kind: pa.DataType) -> None:
    """The view reads a list array's values through its offsets (or its fixed size): a
    slice of an array (a piece that starts inside a row group), whose values begin inside
    the buffer, is viewed as its own rows, not the array's first ones."""
    from shardstream.loader.columns.kinds import tensor_view

    rows = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(10)]
    arr = pa.array(rows, type=kind)
    for lo, n in [(0, 10), (4, 5), (9, 1), (3, 0)]:
        view = tensor_view(arr.slice(lo, n), (3,), 1)
        assert view.tolist() == rows[lo : lo + n]
    nested = pa.array([[r] for r in rows], type=pa.list_(kind, 1)).slice(2, 3)
    assert tensor_view(nested, (1, 3), 2).tolist() == [[r] for r in rows[2:5]]


def test_list_values_are_fitted_in_a_piece_that_starts_inside_a_row_group(
    tmp_path: Path,
) -> None:
    """A list column's numbers are widened and their nulls filled (NaN, `fill_nulls`) value
    by value, also for a rank whose piece starts inside a row group: its arrays are slices,
    whose numbers are read through their offsets, not from the buffer's start."""
    n = 12
    tok = [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(n)]
    f = [[float(i), None if i % 5 == 0 else -float(i)] for i in range(n)]
    k = [[i, None] if i % 4 == 1 else [i, i] for i in range(n)]
    table = pa.table(
        {
            "id": range(n),
            "tok": pa.array(tok, pa.list_(pa.uint16())),
            "f": pa.array(f, pa.list_(pa.float32())),
            "k": pa.array(k, pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=n)  # one row group
    for rank in (0, 1):
        got = batches(str(tmp_path), num_replicas=2, rank=rank, fill_nulls={"k": -1})
        ids = torch.cat([b["id"] for b in got]).tolist()
        assert ids == list(range(6 * rank, 6 * rank + 6))
        tokens = torch.cat([b["tok"] for b in got])
        assert tokens.dtype == torch.int32 and tokens.tolist() == [tok[i] for i in ids]
        floats = torch.cat([b["f"] for b in got])
        nan = float("nan")
        want = torch.tensor([[nan if v is None else v for v in f[i]] for i in ids])
        assert torch.equal(floats.isnan(), want.isnan())
        assert floats.nan_to_num(7.0).tolist() == want.nan_to_num(7.0).tolist()
        filled = [[-1 if v is None else v for v in k[i]] for i in ids]
        assert torch.cat([b["k"] for b in got]).tolist() == filled
