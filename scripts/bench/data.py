"""scripts.bench's data: its shape (columns, batch, tokens and texts of a record) and
its Parquet and tar shards.

scripts.bench's main sets the shape from its arguments here (data.BATCH = ...) and passes
it to each measuring process by environment variables, which that process reads at import
(below): the run modules import the names; the parent's own readers (make_dataset, _texts,
s3.shaped's COLUMNS) read them here when called.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

# the batch-mode columns (--columns)
COLUMNS = os.environ.get("BENCH_COLUMNS", "id,tokens,text").split(",")
SMALL = ["id", "text", "label"]  # small records: the record-mode limit case
# the data's shape (--batch, --tokens, --text-chars; passed to the measuring processes by
# environment variables, so each reads what the parent wrote)
BATCH = int(os.environ.get("BENCH_BATCH", 256))
TOKENS = int(os.environ.get("BENCH_TOKENS", 128))
TEXT_CHARS = os.environ.get("BENCH_TEXT_CHARS", "")  # "A-B": random texts of A..B chars


def make_dataset(root: Path, shards: int, per_shard: int, row_group: int, tar: bool = True) -> None:
    """Parquet shards in root/parquet, the same records as tar shards in root/tar."""
    (root / "parquet").mkdir(parents=True, exist_ok=True)
    (root / "tar").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in tqdm(range(shards), desc="writing shards", leave=False):
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(per_shard, TOKENS), dtype=np.int32)
        texts = _texts(ids, rng)
        flat = pa.FixedSizeListArray.from_arrays(tokens.ravel(), TOKENS)
        table = pa.table(
            {
                "id": ids,
                "tokens": flat.cast(pa.list_(pa.int32())),
                "text": pa.array(texts),
                "label": ids % 10,
            }
        )
        pq.write_table(table, root / "parquet" / f"part-{k:05d}.parquet", row_group_size=row_group)
        if not tar:
            continue
        with tarfile.open(root / "tar" / f"part-{k:05d}.tar", "w") as tf:
            for i, row, text in zip(ids, tokens, texts):
                for ext, data in (
                    ("id", str(i).encode()),
                    ("tokens", row.tobytes()),
                    ("txt", text.encode()),
                ):
                    info = tarfile.TarInfo(f"r{i:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def _texts(ids: np.ndarray, rng: np.random.Generator) -> list[str]:
    """ "document N", or (TEXT_CHARS "A-B") texts of A..B characters."""
    if not TEXT_CHARS:
        return [f"document {i}" for i in ids]
    lo, hi = (int(x) for x in TEXT_CHARS.split("-"))
    base = "the quick brown fox jumps over the lazy dog " * (hi // 44 + 1)
    return [f"{i} {base[: int(n)]}" for i, n in zip(ids, rng.integers(lo, hi + 1, ids.size))]


def tar_shards(data: Path) -> list[Path]:
    """The tar shards under data/tar, in order."""
    return sorted((data / "tar").glob("*.tar"))
