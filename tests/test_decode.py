"""Tar samples decoded as webdataset's ``WebDataset(...).decode(*specs)`` decodes them:
real images written by PIL into a tar by webdataset's TarWriter, compared with what
webdataset itself yields for the same file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader

from shardstream.loader import ShardError, StreamingDataset

N = 6


def image(i: int, mode: str) -> Image.Image:
    """A small image whose pixels depend on i (so samples differ)."""
    y, x = np.mgrid[0:12, 0:10]
    rgb = np.stack([(x * 20 + i) % 256, (y * 15 + 3 * i) % 256, (x * y + i) % 256], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8)).convert(mode)


def encoded(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def shard(tmp_path: Path) -> str:
    path = str(tmp_path / "images-000000.tar")
    with wds.TarWriter(path) as sink:
        for i in range(N):
            sink.write(
                {
                    "__key__": f"sample{i:04d}",
                    "png": encoded(image(i, "RGB"), "PNG"),
                    "jpg": encoded(image(i, "RGB"), "JPEG"),
                    "gray.png": encoded(image(i, "L"), "PNG"),
                    "cls": str(i % 3).encode(),
                    "txt": f"caption {i}".encode(),
                }
            )
    return path


def theirs(path: str, *specs: Any) -> list[dict[str, Any]]:
    return list(wds.WebDataset(path, shardshuffle=False).decode(*specs))


def ours(path: str, decode: Any, **kw: Any) -> list[dict[str, Any]]:
    return list(StreamingDataset(path, shuffle=False, decode=decode, **kw))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, Image.Image):
        return (
            isinstance(b, Image.Image)
            and (a.mode, a.size) == (b.mode, b.size)
            and np.array_equal(np.asarray(a), np.asarray(b))
        )
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and bool(a == b)


def assert_same_samples(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want) == N
    for g, w in zip(got, want):
        assert g["__key__"] == w["__key__"]
        fields = {k for k in w if not k.startswith("__")}
        assert {k for k in g if not k.startswith("__")} == fields
        for k in fields:
            assert same(g[k], w[k]), (g["__key__"], k, type(g[k]), type(w[k]))


@pytest.mark.parametrize("spec", ["pil", "rgb8", "torchrgb", "l", "pilrgba"])
def test_image_specs_decode_as_webdataset_decodes(shard: str, spec: str) -> None:
    got, want = ours(shard, spec), theirs(shard, spec)
    assert_same_samples(got, want)
    assert got[0]["cls"] == 0 and got[1]["txt"] == "caption 1"  # basic handlers still apply
    if spec == "pil":
        assert isinstance(got[2]["jpg"], Image.Image) and got[2]["gray.png"].mode == "RGB"


def test_true_is_webdatasets_basic_handlers(shard: str) -> None:
    got = ours(shard, True)
    assert_same_samples(got, theirs(shard))
    assert isinstance(got[0]["png"], bytes) and got[4]["cls"] == 1


def label_handler(key: str, data: bytes) -> Any:
    return int(data) * 10 if key.endswith(".cls") else None


@pytest.mark.parametrize("specs", [["pil", label_handler], ("rgb8", label_handler)])
def test_a_list_mixes_specs_and_handlers(shard: str, specs: Any) -> None:
    got = ours(shard, specs)
    assert_same_samples(got, theirs(shard, *specs))
    assert [s["cls"] for s in got] == [0, 10, 20, 0, 10, 20]
    assert_same_samples(ours(shard, label_handler), theirs(shard, label_handler))


def test_decoded_in_dataloader_workers(shard: str) -> None:
    ds = StreamingDataset(shard, shuffle=False, decode="torchrgb8")
    got = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert_same_samples(sorted(got, key=lambda s: s["__key__"]), theirs(shard, "torchrgb8"))


@pytest.mark.parametrize(
    ("decode", "error", "message"),
    [
        ("PIL", ValueError, r"unknown image spec 'PIL'; webdataset's are \[.*'pil', .*'rgb8'"),
        (["pil", "jpeg"], ValueError, r"unknown image spec 'jpeg'"),
        (3, TypeError, r"decode must be True, an image spec .*got 3 \(int\)"),
        (["pil", 3], TypeError, r"decode: 3 \(int\) is neither an image spec"),
        (lambda sample: sample, TypeError, r"cannot be called as handler\(key, data\)"),
    ],
)
def test_bad_specs_fail_in_the_constructor(
    shard: str, decode: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        StreamingDataset(shard, decode=decode)


def test_an_undecodable_image_names_shard_sample_and_field(tmp_path: Path) -> None:
    path = str(tmp_path / "bad.tar")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "good", "png": encoded(image(0, "RGB"), "PNG")})
        sink.write({"__key__": "broken", "png": b"\x89PNG not really"})
    with pytest.raises(ShardError, match=r"bad.tar: cannot decode field 'png' of sample 'broken'"):
        ours(path, "pil")
