"""No option is accepted and then ignored (loader.options): each is refused where it would
do nothing, or raises where it would break what the loader promises, naming the option."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from shardstream.loader import Stream, StreamingDataset
from shardstream.loader.cursor import rows_of


@pytest.fixture
def images(tmp_path: Path) -> str:
    # a Parquet column of PNG bytes, as HF datasets and pandas users write images
    pngs = []
    for i in range(6):
        out = io.BytesIO()
        Image.fromarray(np.full((4, 4, 3), i, dtype=np.uint8)).save(out, format="PNG")
        pngs.append(out.getvalue())
    table = pa.table({"id": np.arange(6), "image": pngs, "flag": [True, False] * 3})
    pq.write_table(table, tmp_path / "images.parquet")
    return str(tmp_path / "images.parquet")


@pytest.mark.parametrize("decode", [True, "pil", "rgb8"])
def test_decode_on_parquet_is_refused_naming_what_it_applies_to(images: str, decode: Any) -> None:
    with pytest.raises(ValueError, match=r"decode=.*tar shards' members.*parquet.*transform="):
        StreamingDataset(images, decode=decode)
    with pytest.raises(ValueError, match=r"decode=.*tar shards' members"):
        StreamingDataset([Stream(images, name="a"), Stream(images, name="b")], decode=decode)


def test_allow_pickle_without_tar_is_refused(images: str) -> None:
    with pytest.raises(ValueError, match=r"allow_pickle=True.*parquet.*hold no pickles"):
        StreamingDataset(images, allow_pickle=True)


def test_the_decode_advice_works(images: str) -> None:
    # what the message says to do gives the images
    def to_image(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "image": Image.open(io.BytesIO(record["image"]))}

    records = list(StreamingDataset(images, shuffle=False, transform=to_image))
    assert [r["id"] for r in records] == list(range(6))
    assert [np.asarray(r["image"])[0, 0, 0] for r in records] == list(range(6))


@pytest.mark.parametrize("drop", [1, 3])
def test_a_batch_transform_that_changes_the_row_count_raises(images: str, drop: int) -> None:
    ds = StreamingDataset(
        images, batch_size=3, columns=["id"], transform=lambda b: {"id": b["id"][drop:]}
    )
    with pytest.raises(ValueError, match=r"transform= turned a batch of 3 rows into one of"):
        list(ds)


@pytest.mark.parametrize(
    "transform",
    [
        lambda b: {"id": b["id"] * 2},  # a dict of the same rows
        lambda b: (b["id"].float(), b["id"]),  # (inputs, targets)
        lambda b: b["id"][:, None].float(),  # a tensor
        lambda b: {"n": len(b["id"]), "id": b["id"]},  # a dict led by a scalar
    ],
)
def test_a_batch_transform_keeping_the_rows_is_fine(images: str, transform: Any) -> None:
    ds = StreamingDataset(images, batch_size=4, columns=["id"], shuffle=False, transform=transform)
    assert len(list(ds)) == len(ds) == 2


def test_rows_of_what_transforms_return() -> None:
    assert rows_of({"a": torch.zeros(5, 2), "b": ["x"] * 5}) == 5
    assert rows_of((np.zeros(3), np.zeros(3))) == 3
    assert rows_of([{"a": 1}, {"a": 2}]) == 2  # a list of records
    assert rows_of([torch.zeros(4), torch.zeros(4)]) == 4  # a list of tensors
    assert rows_of(torch.tensor(1.0)) is None and rows_of("text") is None and rows_of(3) is None


def test_a_column_named_twice_is_refused_by_name(images: str) -> None:
    with pytest.raises(ValueError, match=r"columns names \['id'\] more than once"):
        StreamingDataset(images, columns=["id", "image", "id"])


@pytest.mark.parametrize(("option", "value"), [("fill_nulls", {"id": -1}), ("pad", {"image": 0})])
def test_batch_options_without_batches_are_refused(images: str, option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"{option} shape the tensors of batches \(batch_size"):
        StreamingDataset(images, **{option: value})


def test_a_null_in_a_bool_column_asks_for_a_bool_fill(tmp_path: Path) -> None:
    pq.write_table(pa.table({"flag": pa.array([True, None, False])}), tmp_path / "b.parquet")
    ds = StreamingDataset(str(tmp_path / "b.parquet"), batch_size=3, shuffle=False)
    with pytest.raises(Exception, match=r"bool") as caught:
        list(ds)
    assert "integer tensor" not in str(caught.value)
    filled = StreamingDataset(
        str(tmp_path / "b.parquet"), batch_size=3, shuffle=False, fill_nulls={"flag": False}
    )
    assert [b["flag"].tolist() for b in filled] == [[True, False, False]]
