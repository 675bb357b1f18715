"""Data in which every column of a row carries the row's id, so that a row put together from
two records cannot hide: the property tests of "a row of a batch is one record" read it.

Record id i (unique over all streams: stream s holds ids s * STRIDE + j) is in every column:
as a number, a string, a float, a fixed list, a ragged list (its length varies with i too),
a nullable int and float (null for some ids), a timestamp; in tar shards as the key, a text
field, a JSON field and a class field. The expected record is what pyarrow (Parquet) and
webdataset (tar) read from the same files, never what this module meant to write.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import webdataset as wds

STRIDE = 100_000
FILL = -1  # fill_nulls for the nullable int column
PAD = -7  # pad value of the ragged list column
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("id_str", pa.string()),
        ("id_f", pa.float64()),
        ("fixed", pa.list_(pa.int64())),
        ("ragged", pa.list_(pa.int32())),
        ("maybe", pa.int64()),
        ("maybe_f", pa.float32()),
        ("ts", pa.timestamp("us")),
    ]
)


def table(ids: np.ndarray) -> pa.Table:
    ids = ids.astype(np.int64)
    return pa.table(
        {
            "id": ids,
            "id_str": [f"r{i}" for i in ids],
            "id_f": ids + 0.5,
            "fixed": [[int(i), int(i) * 2, int(i) * 3] for i in ids],
            "ragged": [[int(i) % 1000] * (1 + int(i) % 4) for i in ids],
            "maybe": pa.array([None if i % 3 == 0 else int(i) for i in ids], pa.int64()),
            "maybe_f": pa.array([None if i % 4 == 1 else float(i) for i in ids], pa.float32()),
            "ts": pa.array(ids * 1000, pa.timestamp("us")),
        },
        schema=SCHEMA,
    )


def write_parquet(root: Path, stream: int, sizes: list[int], row_group_size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    first = stream * STRIDE
    for k, n in enumerate(sizes):
        ids = np.arange(first, first + n)
        pq.write_table(table(ids), root / f"part-{k:03d}.parquet", row_group_size=row_group_size)
        first += n


def write_arrow(root: Path, stream: int, sizes: list[int], batch_rows: int) -> None:
    """Arrow IPC files (pyarrow's file format), record batches of `batch_rows`."""
    import pyarrow.ipc as ipc

    root.mkdir(parents=True, exist_ok=True)
    first = stream * STRIDE
    for k, n in enumerate(sizes):
        t = table(np.arange(first, first + n))
        with ipc.new_file(str(root / f"part-{k:03d}.arrow"), t.schema) as sink:
            for batch in t.to_batches(max_chunksize=batch_rows):
                sink.write_batch(batch)
        first += n


def write_tar(root: Path, stream: int, sizes: list[int]) -> None:
    """Shards written by webdataset's TarWriter: key, text, JSON and class fields."""
    root.mkdir(parents=True, exist_ok=True)
    first = stream * STRIDE
    for k, n in enumerate(sizes):
        with wds.TarWriter(str(root / f"part-{k:03d}.tar")) as sink:
            for i in range(first, first + n):
                sink.write(
                    {"__key__": f"{i:08d}", "txt": f"r{i}", "json": {"id": i}, "cls": i % 1000}
                )
        first += n


def columns_expected(root: Path, fmt: str = "parquet") -> dict[int, dict[str, Any]]:
    """id -> the row as pyarrow.dataset reads it (Python values); fmt "parquet" or "arrow"."""
    import pyarrow.dataset as ds

    rows = ds.dataset(str(root), format="ipc" if fmt == "arrow" else fmt).to_table().to_pylist()
    return {r["id"]: r for r in rows}


def tar_expected(root: Path, decode: bool) -> dict[int, dict[str, Any]]:
    """id -> the sample as webdataset reads it (decoded with its basic handlers, or raw)."""
    urls = sorted(str(p) for p in root.glob("*.tar"))
    pipe = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if decode:
        pipe = pipe.decode()
    out = {}
    for sample in pipe:
        sample = {k: v for k, v in sample.items() if k != "__local_path__"}
        out[int(sample["__key__"])] = sample
    return out


def row_id(row: Mapping[str, Any]) -> int:
    return int(row["id"]) if "id" in row else int(row["__key__"])


def rows_of(item: Mapping[str, Any], batch: bool) -> Iterator[dict[str, Any]]:
    """The rows of a yielded item as Python values: a record is one row; a batch gives one
    row per index, every column cut at that index (a padded column cut to its length)."""
    if not batch:
        yield {k: _py(v) for k, v in item.items()}
        return
    n = len(next(iter(item.values())))
    for i in range(n):
        row = {k: _py(v[i]) for k, v in item.items()}
        for key in [k for k in row if k.endswith("__len")]:
            col, length = key.removesuffix("__len"), row.pop(key)
            padded = row[col]
            assert all(x == PAD for x in padded[length:]), (col, padded, length)
            row[col] = padded[:length]
        yield row


def _py(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, np.ndarray | np.generic):
        return v.tolist()
    return v


def same(got: Any, want: Any) -> bool:
    """Equal, with NaN equal to NaN and ints equal to equal floats."""
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, list | tuple):
        return (
            isinstance(got, list | tuple)
            and len(got) == len(want)
            and all(same(g, w) for g, w in zip(got, want))
        )
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same(got[k], want[k]) for k in want)
        )
    return bool(got == want)


def batch_view(record: dict[str, Any]) -> dict[str, Any]:
    """A Parquet record as a batch row shows it: nulls filled (FILL) or NaN."""
    out = dict(record)
    if "maybe" in out and out["maybe"] is None:
        out["maybe"] = FILL
    if "maybe_f" in out and out["maybe_f"] is None:
        out["maybe_f"] = float("nan")
    return out
