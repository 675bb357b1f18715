"""scripts.bench.cloud's data: the Parquet and tar shards (written once per invocation),
their upload to the moto S3 server with the saved indexes, and the column-chunk byte
ranges the raw ranged reader fetches (from the Parquet metadata)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from scripts.bench.cloud import BUCKET, PER_SHARD, ROW_GROUP, SHARDS, TEXT_CHARS, TOKENS

_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)


def shard_name(k: int, ext: str) -> str:
    return f"part-{k:05d}.{ext}"


def _texts(rng: np.random.Generator, n: int) -> list[str]:
    """n texts of TEXT_CHARS characters (letters and spaces), cut from one random run."""
    lo, hi = TEXT_CHARS
    run = _LETTERS[rng.integers(0, _LETTERS.size, size=n * hi + hi)].tobytes().decode()
    lengths = rng.integers(lo, hi + 1, size=n)
    starts = rng.integers(0, n * hi, size=n)
    return [run[a : a + m] for a, m in zip(starts.tolist(), lengths.tolist())]


def _tar(path: Path, ids: np.ndarray, tokens: np.ndarray, texts: list[str]) -> None:
    """The records as WebDataset members KEY.id, KEY.tokens (raw int32 bytes), KEY.txt."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, row, text in zip(ids.tolist(), tokens, texts):
            key = f"{i:09d}"
            for ext, payload in (
                ("id", str(i).encode()),
                ("tokens", row.tobytes()),
                ("txt", text.encode()),
            ):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                info.mtime = 0
                tf.addfile(info, io.BytesIO(payload))


def write_shards(root: Path, tar: bool) -> tuple[list[Path], list[Path]]:
    """SHARDS Parquet shards of PER_SHARD records under root/pq (row groups of ROW_GROUP)
    and, with `tar`, the same records as tar shards under root/tar (seeded: the same
    bytes on every invocation and checkout)."""
    (root / "pq").mkdir(parents=True, exist_ok=True)
    (root / "tar").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    parquet, tars = [], []
    for k in tqdm(range(SHARDS), desc="writing shards", leave=False):
        ids = np.arange(k * PER_SHARD, (k + 1) * PER_SHARD, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(PER_SHARD, TOKENS), dtype=np.int32)
        texts = _texts(rng, PER_SHARD)
        flat = pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), TOKENS)
        table = pa.table(
            {"id": ids, "tokens": flat.cast(pa.list_(pa.int32())), "text": pa.array(texts)}
        )
        parquet.append(root / "pq" / shard_name(k, "parquet"))
        pq.write_table(table, parquet[-1], row_group_size=ROW_GROUP)
        if tar:
            tars.append(root / "tar" / shard_name(k, "tar"))
            _tar(tars[-1], ids, tokens, texts)
    return parquet, tars


def upload(endpoint: str, parquet: list[Path], tars: list[Path], copy: bool) -> dict[str, Any]:
    """Put the shards in the bucket (unshaped, straight to moto): the Parquet shards under
    pq/ (and, with `copy`, again under pq2/), the tars under tar/ (public-read: webdataset
    reads them over plain HTTP), and each prefix's saved index beside it
    (``pq.index.arrow``...: ShardIndex.build(prefix).save(...), not timed). Returns the
    storage options that reach moto directly."""
    import s3fs

    from shardstream import ShardIndex

    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    fs.mkdir(BUCKET)
    puts: list[tuple[Path, str, dict[str, str]]] = [
        (p, f"{BUCKET}/pq/{p.name}", {}) for p in parquet
    ]
    if copy:
        puts += [(p, f"{BUCKET}/pq2/{p.name}", {}) for p in parquet]
    puts += [(p, f"{BUCKET}/tar/{p.name}", {"ACL": "public-read"}) for p in tars]
    for path, key, extra in tqdm(puts, desc="uploading", leave=False):
        fs.put_file(str(path), key, **extra)
    prefixes = ["pq"] + (["pq2"] if copy else []) + (["tar"] if tars else [])
    for prefix in tqdm(prefixes, desc="saving indexes", leave=False):
        index = ShardIndex.build(f"s3://{BUCKET}/{prefix}/", options)
        index.save(f"s3://{BUCKET}/{prefix}.index.arrow", options)
    return options


def column_ranges(path: Path, columns: list[str]) -> dict[str, Any]:
    """A local Parquet shard's size and the [start, end) byte ranges of the column chunks
    of `columns` in every row group, in file order, then its footer (the metadata and the
    8-byte tail): what a reader of those columns must fetch."""
    size = path.stat().st_size
    meta = pq.ParquetFile(path).metadata
    ranges = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] not in columns:
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                start = min(start, chunk.dictionary_page_offset)
            ranges.append([start, start + chunk.total_compressed_size])
    with path.open("rb") as f:
        f.seek(size - 8)
        footer = int.from_bytes(f.read(4), "little") + 8
    ranges.append([size - footer, size])
    return {"size": size, "ranges": ranges}
