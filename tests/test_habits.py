"""The habits webdataset and HF `datasets` users bring: brace shard names, stacked image
batches, a per-record transform, padded columns with their lengths, `datasets.Dataset`
objects as a source. Compared with what webdataset and `datasets` give for the same
files."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader

from shardstream.loader import ShardError, Stream, StreamingDataset
from tests.conftest import S3
from tests.datagen import SIZES, record_id, write_dataset


def _png(i: int, size: tuple[int, int]) -> bytes:
    arr = np.full((size[1], size[0], 3), (i * 7) % 256, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")  # lossless: exact comparisons
    return buf.getvalue()


def image_shards(root: Path, sizes: list[tuple[int, int]], per_shard: int = 5) -> list[str]:
    """Shards images-000000.tar ... with webdataset's TarWriter; sample i has image size
    sizes[i % len(sizes)]."""
    root.mkdir(parents=True, exist_ok=True)
    paths, n = [], 0
    for k in range(3):
        path = str(root / f"images-{k:06d}.tar")
        with wds.TarWriter(path) as sink:
            for _ in range(per_shard):
                png = _png(n, sizes[n % len(sizes)])
                sink.write({"__key__": f"s{n:04d}", "png": png, "cls": n})
                n += 1
        paths.append(path)
    return paths


# --- brace URLs ---------------------------------------------------------------------------


def test_brace_urls_name_shards_as_webdataset_does(tmp_path: Path) -> None:
    paths = image_shards(tmp_path, [(4, 4)])
    pattern = str(tmp_path / "images-{000000..000002}.tar")
    ours = sorted(r["__key__"] for r in StreamingDataset(pattern))
    theirs = sorted(s["__key__"] for s in wds.WebDataset(pattern, shardshuffle=False))
    assert ours == theirs and len(ours) == 15
    two = StreamingDataset([str(tmp_path / "images-{000000,000002}.tar")], shuffle=False)
    assert {r["__url__"] for r in two} == {paths[0], paths[2]}


def test_a_brace_range_past_the_shards_names_the_missing_one(tmp_path: Path) -> None:
    image_shards(tmp_path, [(4, 4)])
    with pytest.raises(FileNotFoundError, match=r"images-000003\.tar"):
        StreamingDataset(str(tmp_path / "images-{000000..000003}.tar"))


def test_brace_urls_on_s3(s3: S3, tmp_path: Path) -> None:
    fs = s3.fs()
    fs.mkdir("bucket")
    write_dataset(fs, "bucket/pq", "parquet")
    url = "s3://bucket/pq/part-{00000..00005}.parquet"
    ds = StreamingDataset(url, storage_options=s3.storage_options, shuffle=False)
    assert [record_id(r) for r in ds] == list(range(sum(SIZES)))


# --- stacked tensors in tar batches -------------------------------------------------------


@pytest.mark.parametrize(("spec", "shape"), [("torchrgb", (4, 3, 6, 5)), ("rgb8", (4, 6, 5, 3))])
def test_decoded_images_of_one_size_stack_as_webdataset_batches_them(
    tmp_path: Path, spec: str, shape: tuple[int, ...]
) -> None:
    image_shards(tmp_path, [(5, 6)])
    ds = StreamingDataset(str(tmp_path), decode=spec, batch_size=4, shuffle=False)
    batches = list(DataLoader(ds, batch_size=None, num_workers=1))
    assert isinstance(batches[0]["png"], torch.Tensor) and tuple(batches[0]["png"].shape) == shape
    assert batches[0]["cls"].tolist() == [0, 1, 2, 3]
    theirs = wds.WebDataset(str(tmp_path / "images-{000000..000002}.tar"), shardshuffle=False)
    ref = {s["__key__"]: s["png"] for s in theirs.decode(spec)}
    for b in batches:
        for key, img in zip(b["__key__"], b["png"]):
            assert np.array_equal(np.asarray(img), np.asarray(ref[key]))


def test_images_of_different_sizes_stay_a_list(tmp_path: Path) -> None:
    image_shards(tmp_path, [(5, 6), (7, 3)])
    ds = StreamingDataset(str(tmp_path), decode="torchrgb", batch_size=4, shuffle=False)
    for b in ds:
        assert isinstance(b["png"], list) and len(b["png"]) == len(b["__key__"])


def test_a_later_batch_that_cannot_stack_names_field_and_sample(tmp_path: Path) -> None:
    sizes = [(5, 6)] * 14 + [(7, 3)]  # the last sample differs
    image_shards(tmp_path, sizes)
    ds = StreamingDataset(str(tmp_path), decode="torchrgb", batch_size=4, shuffle=False)
    with pytest.raises(ShardError, match=r"field 'png' of sample 's0014'.*shape \[3, 3, 7\]"):
        list(ds)


# --- transform= ---------------------------------------------------------------------------


def double(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "twice": int(record["id"]) * 2}


def add_mask(batch: dict[str, Any]) -> dict[str, Any]:
    batch["mask"] = batch["id"] % 2 == 0
    return batch


@pytest.fixture
def parquet(tmp_path: Path) -> str:
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "pq"), "parquet")
    return str(tmp_path / "pq")


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_runs_on_each_record_where_records_are_made(parquet: str, workers: int) -> None:
    ds = StreamingDataset(parquet, columns=["id"], transform=double)
    got = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(got) == len(ds) == sum(SIZES)
    assert all(r["twice"] == 2 * r["id"] for r in got)


def test_transform_in_batch_mode_gets_each_batch(parquet: str) -> None:
    ds = StreamingDataset(parquet, columns=["id"], batch_size=16, transform=add_mask)
    got = list(ds)
    assert len(got) == len(ds)
    assert all(torch.equal(b["mask"], b["id"] % 2 == 0) for b in got)


def test_transform_keeps_resume_exact(parquet: str) -> None:
    ds = StreamingDataset(parquet, columns=["id"], transform=double, seed=4)
    ds.set_epoch(2)
    it = iter(ds)
    first = [next(it) for _ in range(30)]
    state = ds.state_dict()
    again = StreamingDataset(parquet, columns=["id"], transform=double, seed=4)
    again.load_state_dict(state)
    rest = list(again)
    assert all("twice" in r for r in rest)
    assert sorted(r["id"] for r in [*first, *rest]) == list(range(sum(SIZES)))


def test_a_transform_returning_none_or_not_callable_is_refused(parquet: str) -> None:
    with pytest.raises(TypeError, match="returned None"):
        list(StreamingDataset(parquet, columns=["id"], transform=lambda r: None))
    with pytest.raises(TypeError, match="transform must be a function"):
        StreamingDataset(parquet, transform="lower")  # type: ignore[arg-type]


def test_transform_on_a_mixture(parquet: str) -> None:
    ds = StreamingDataset(
        [Stream(parquet, name="a"), Stream(parquet, name="b")], columns=["id"], transform=double
    )
    got = list(ds)
    assert len(got) == len(ds) and all(r["twice"] == 2 * r["id"] for r in got)


# --- padded columns carry their lengths ---------------------------------------------------


def ragged(tmp_path: Path, rows: int = 100) -> tuple[str, list[list[int]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokens = [[i + 1] * (i % 7 + 1) for i in range(rows)]  # no zero inside the data
    root = tmp_path / "ragged"
    root.mkdir()
    for k in range(2):
        half = slice(k * rows // 2, (k + 1) * rows // 2)
        table = pa.table({"id": list(range(rows))[half], "tokens": tokens[half]})
        pq.write_table(table, root / f"part-{k}.parquet", row_group_size=9)
    return str(root), tokens


@pytest.mark.parametrize("batch_size", [4, 32])
def test_pad_gives_each_rows_length(tmp_path: Path, batch_size: int) -> None:
    root, tokens = ragged(tmp_path)
    ds = StreamingDataset(root, batch_size=batch_size, pad={"tokens": 0}, seed=1)
    seen = 0
    for b in ds:
        lengths = b["tokens__len"]
        assert lengths.dtype == torch.int64 and b["tokens"].shape[1] == int(lengths.max())
        mask = torch.arange(b["tokens"].shape[1]) < lengths[:, None]
        for i, row, n, m in zip(b["id"].tolist(), b["tokens"], lengths.tolist(), mask):
            assert n == len(tokens[i]) and row[m].tolist() == tokens[i]
            assert (row[~m] == 0).all()
            seen += 1
    assert seen == len(tokens)


@pytest.mark.parametrize("batch_size", [8, 300])
def test_pad_lengths_in_a_mixture(tmp_path: Path, batch_size: int) -> None:
    # as for one source: each batch padded to its own longest row (a mixture gathers a
    # slab of batches at once, and cuts and pads each batch alone)
    root, tokens = ragged(tmp_path)
    ds = StreamingDataset(
        [Stream(root, name="a"), Stream(root, name="b")],
        batch_size=batch_size,
        pad={"tokens": 0},
    )
    seen = 0
    for b in ds:
        lengths = b["tokens__len"]
        assert lengths.tolist() == [len(tokens[i]) for i in b["id"].tolist()]
        assert b["tokens"].shape[1] == int(lengths.max())
        for i, row, n in zip(b["id"].tolist(), b["tokens"], lengths.tolist()):
            assert row[:n].tolist() == tokens[i] and (row[n:] == 0).all()
        seen += len(lengths)
    assert seen == ds.sampler.epoch_size == 200


def test_a_column_named_like_the_lengths_is_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"t": [[1], [2, 3]], "t__len": [1, 2]}), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match=r"t__len"):
        StreamingDataset(str(tmp_path / "x.parquet"), batch_size=2, pad={"t": 0})


# --- HF datasets --------------------------------------------------------------------------


@pytest.fixture
def hf_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    d = datasets.Dataset.from_dict({"id": list(range(40)), "text": [f"t{i}" for i in range(40)]})
    d.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    return datasets.load_from_disk(str(tmp_path / "saved"))


def test_a_datasets_dataset_is_read_from_its_arrow_files(hf_saved: Any) -> None:
    ds = StreamingDataset(hf_saved, shuffle=False)
    assert list(ds) == hf_saved.to_list()
    mapped = hf_saved.map(lambda r: {"twice": r["id"] * 2})
    got = sorted((r["id"], r["twice"]) for r in StreamingDataset(mapped))
    assert got == [(i, 2 * i) for i in range(40)]


def test_what_a_dataset_holds_only_in_memory_is_refused_by_name(hf_saved: Any) -> None:
    import datasets

    cases = {
        "in-memory": datasets.Dataset.from_dict({"a": [1, 2]}),
        "DatasetDict": datasets.DatasetDict(train=hf_saved),
        "indices mapping": hf_saved.shuffle(seed=0),
        "its files hold 40 rows and columns \\['id', 'text'\\]": hf_saved.remove_columns("text"),
    }
    for what, source in cases.items():
        with pytest.raises(ValueError, match=what):
            StreamingDataset(source)
    flat = hf_saved.shuffle(seed=0).flatten_indices()
    assert sorted(r["id"] for r in StreamingDataset(flat)) == list(range(40))
