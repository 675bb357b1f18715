"""Columns to tensors or lists, gathering from a block, regrouping chunks into batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from shardstream.loader.columns.batch_format import arrow_kinds
from shardstream.loader.columns.batching import column_to_batch, regroup
from shardstream.loader.columns.gather import Block, gather
from shardstream.loader.columns.kinds import kinds_of
from shardstream.loader.formats.parquet.format import ParquetFormat


def values(col: Any) -> list[Any]:
    """A taken column's values: numpy (numbers, or Python objects in record mode) or Arrow."""
    return col.tolist() if isinstance(col, np.ndarray) else col.to_pylist()


def test_what_becomes_a_tensor() -> None:
    assert torch.equal(column_to_batch(pa.array([1, 2, 3])), torch.tensor([1, 2, 3]))
    assert column_to_batch(pa.array([True, False])).dtype == torch.bool
    fixed = column_to_batch(pa.array([[1, 2], [3, 4]], pa.list_(pa.int16())))
    assert fixed.shape == (2, 2) and fixed.dtype == torch.int16
    assert column_to_batch(pa.array([1, None])) == [1, None]  # nulls: no silent fill value
    assert column_to_batch(pa.array([[1], [2, 3]])) == [[1], [2, 3]]  # ragged
    assert column_to_batch(pa.array(["a", "b"])) == ["a", "b"]
    sliced = pa.array([[0, 0], [1, 2], [3, 4]]).slice(1)  # offsets respected
    assert column_to_batch(sliced).tolist() == [[1, 2], [3, 4]]


def test_block_gather_matches_arrow_take_across_chunks() -> None:
    def part(first: int, n: int) -> pa.Table:
        ids = np.arange(first, first + n)
        t = pa.table({"id": ids, "tok": [[int(i)] * 3 for i in ids], "s": [str(i) for i in ids]})
        return pa.concat_tables([t.slice(0, n // 2), t.slice(n // 2)])  # two chunks a column

    parts = [part(0, 10), part(10, 7), part(17, 5)]
    rows = np.random.default_rng(0).permutation(22)
    got = Block(parts).take(rows)
    want = pa.concat_tables(parts).take(pa.array(rows))
    assert got["id"].tolist() == want["id"].to_pylist()
    assert isinstance(got["tok"], np.ndarray) and got["tok"].tolist() == want["tok"].to_pylist()
    assert values(got["s"]) == want["s"].to_pylist()
    assert list(Block.records(got, step=4)) == want.to_pylist()


def test_taken_rows_survive_the_release_of_the_block() -> None:
    """A take is a copy: releasing the block (its group let go) leaves taken rows intact,
    and the block's numeric columns are views of the decoded buffers, not copies."""

    def block(first: int) -> Block:
        ids = np.arange(first, first + 6)
        return Block([pa.table({"id": ids, "tok": [[int(i)] * 2 for i in ids]})])

    one = block(0)
    assert isinstance(one.arrays["id"], np.ndarray) and one.arrays["tok"].shape == (6, 2)
    kept = one.take(np.array([5, 0, 3]))
    one.release()
    two = block(100)
    assert kept["id"].tolist() == [5, 0, 3] and kept["tok"].tolist() == [[5, 5], [0, 0], [3, 3]]
    assert two.take(np.array([1]))["tok"].tolist() == [[101, 101]]


def test_gather_from_several_blocks() -> None:
    """Records of several groups come out in the asked order: numeric columns by one copy
    a block into a fresh array, others via one Arrow take over the blocks' arrays; a block
    a gather takes nothing from is fine, and the result survives the blocks' release."""
    blocks = [
        Block([pa.table({"id": np.arange(k * 1000, k * 1000 + n), "s": [f"r{k}"] * n})])
        for k, n in enumerate([700, 1500, 3000, 10])
    ]
    rng = np.random.default_rng(1)
    which = rng.integers(0, 3, 500)  # block 3 gives nothing
    rows = np.array([rng.integers(0, [700, 1500, 3000][w]) for w in which])
    got = gather(blocks, which, rows)
    for b in blocks:
        b.release()
    assert got["id"].tolist() == (which * 1000 + rows).tolist()
    assert values(got["s"]) == [f"r{w}" for w in which]
    mixed = [
        Block([pa.table({"id": np.arange(5)})]),
        Block([pa.table({"id": pa.array([7, None, 9])})]),  # nulls: kept as Arrow
    ]
    taken = gather(mixed, np.array([1, 0, 1]), np.array([2, 4, 1]))
    assert values(taken["id"]) == [9, 4, None]


def test_torch_batch_strings_are_picked_as_python_objects() -> None:
    """Strings and bytes of a torch batch are made Python objects once a block and picked
    per record like numbers (Arrow's take joins every chunk of strings first); the batch's
    lists equal pyarrow's rows, nulls included. Arrow batches keep them Arrow."""
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("b", pa.large_binary())])

    def table(k: int) -> pa.Table:
        ids = range(k * 10, k * 10 + 10)
        s = [None if i % 7 == 0 else f"s{i}" * (i % 3) for i in ids]
        return pa.table({"id": list(ids), "s": s, "b": [bytes([i]) * (i % 4) for i in ids]}, schema)

    tables = [table(k) for k in range(3)]
    kinds = kinds_of(schema)
    blocks = [Block([t], kinds) for t in tables]
    assert all(b.arrays[c].dtype == object for b in blocks for c in ("s", "b"))
    rng = np.random.default_rng(2)
    which, rows = rng.integers(0, 3, 25), rng.integers(0, 10, 25)
    got = ParquetFormat(schema=schema, kinds=kinds).batch(gather(blocks, which, rows))
    want = pa.concat_tables(tables).take(pa.array(which * 10 + rows))
    assert got["s"] == want["s"].to_pylist() and got["b"] == want["b"].to_pylist()
    assert got["id"].tolist() == want["id"].to_pylist()
    one = ParquetFormat(schema=schema, kinds=kinds).batch(blocks[1].take(np.array([3, 4, 0])))
    assert one["s"] == ["s13", None, "s10"] and one["b"] == [b"\r", b"\x0e\x0e", b"\n\n"]
    arrow = Block([tables[0]], arrow_kinds(schema))
    assert set(arrow.columns) == {"s", "b"}


def test_block_columns_that_stay_arrow() -> None:
    parts = [
        pa.table({"x": pa.array([1, None]), "r": pa.array([[1], [2, 3]])}),
        pa.table({"x": pa.array([3, 4]), "r": pa.array([[4, 5], [6, 7]])}),
    ]
    got = Block(parts).take(np.array([3, 1, 0]))
    assert values(got["x"]) == [4, None, 1]  # nulls: no fill value invented
    assert values(got["r"]) == [[6, 7], [2, 3], [1]]  # ragged in one part
    records = list(Block.records(got))
    assert records == [{"x": 4, "r": [6, 7]}, {"x": None, "r": [2, 3]}, {"x": 1, "r": [1]}]


def test_regroup_slices_and_joins_chunks() -> None:
    chunks = [
        {"x": torch.arange(0, 5), "s": list("abcde")},
        {"x": torch.arange(5, 12), "s": list("fghijkl")},
        {"x": [12, 13], "s": ["m", "n"]},  # a chunk whose column fell back to a list
    ]
    batches = list(regroup(iter(chunks), 4))
    assert [len(b["s"]) for b in batches] == [4, 4, 4, 2]
    assert torch.equal(batches[1]["x"], torch.tensor([4, 5, 6, 7]))  # across two chunks
    assert torch.equal(batches[2]["x"], torch.arange(8, 12))  # inside one chunk: a view
    assert batches[3]["x"] == [12, 13] and batches[3]["s"] == ["m", "n"]
    assert "".join(c for b in batches for c in b["s"]) == "abcdefghijklmn"
