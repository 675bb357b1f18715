"""The test corpora other projects wrote (tests/data/corpora, see its SOURCES.md): unpacked
once a session, and the reference outcome of each file computed by the tool that wrote
the convention (pyarrow.parquet.read_table, webdataset.WebDataset)."""

from __future__ import annotations

import lzma
import math
from pathlib import Path
from typing import Any

CORPORA = Path(__file__).parent / "data" / "corpora"


def unpack(dest: Path) -> dict[str, Path]:
    """{"parquet/name.parquet": path, ...}: every corpus file under `dest`, ``.xz``
    unpacked and ``.parquet.encrypted`` named ``.parquet`` (as a shard would be)."""
    out = {}
    for folder in ("parquet", "bad", "encrypted", "wds"):
        (dest / folder).mkdir(parents=True, exist_ok=True)
        for f in sorted((CORPORA / folder).iterdir()):
            name = f.name.removesuffix(".xz").removesuffix(".encrypted")
            target = dest / folder / name
            data = f.read_bytes()
            target.write_bytes(lzma.decompress(data) if f.suffix == ".xz" else data)
            out[f"{folder}/{name}"] = target
    return out


def corpus_names() -> list[str]:
    return [
        f"{folder}/{f.name.removesuffix('.xz').removesuffix('.encrypted')}"
        for folder in ("parquet", "bad", "encrypted", "wds")
        for f in sorted((CORPORA / folder).iterdir())
    ]


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN (Arrow's to_pylist gives fresh float objects)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def batch_same(ours: Any, want: Any) -> bool:
    """A batch column's value against pyarrow's: a null float is NaN in a tensor."""
    if want is None and isinstance(ours, float):
        return math.isnan(ours)
    if isinstance(want, list) and isinstance(ours, list):
        return len(want) == len(ours) and all(batch_same(o, w) for o, w in zip(ours, want))
    if isinstance(want, int) and isinstance(ours, float | int) and not isinstance(want, bool):
        return ours == want
    return same(ours, want)


def batch_columns(batches: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Batches as whole columns of Python values (tensors as lists), in order."""
    import torch

    out: dict[str, list[Any]] = {}
    for b in batches:
        for k, v in b.items():
            out.setdefault(k, []).extend(v.tolist() if isinstance(v, torch.Tensor) else v)
    return out


def webdataset_samples(path: Path) -> list[dict[str, Any]]:
    """webdataset's raw samples of a shard (no decoding), in order."""
    import webdataset as wds

    return list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))
