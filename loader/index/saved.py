"""A saved index: the index table (loader.index.table) as one Arrow IPC file.

The file's schema metadata holds the format version, the shard format, the Parquet file
schemas and the Hive partitioning; its one record batch is the table. A local file is
memory-mapped: loading reads the footer, and a column's pages (a tar shard's member table)
are read from disk when a reader first touches them, so a saved index of 480,000 tar
members costs little memory until its shards are read. One saved to remote storage (S3,
HTTP) is zstd-compressed: it is read whole, and compression makes that read 3-5x smaller.
JSON indexes (version 2) still load (loader.index.shard_index).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..formats.parquet.meta import schema_to_b64
from ..storage.filesystems import redact, strip_credentials
from .urls import relative, with_base

__all__ = ["ARROW_MAGIC", "TABLE_VERSION", "portable", "read_table", "write_index", "write_table"]

log = logging.getLogger(__name__)

TABLE_VERSION = 3
ARROW_MAGIC = b"ARROW1"


def portable(table: pa.Table) -> pa.Table:
    """An index table (its URLs full: no base) as it is saved: without credentials in its
    URLs, and relative local paths made absolute (the index may be loaded elsewhere)."""
    urls = table.column("url").combine_chunks()
    if pc.any(pc.match_substring(urls, "@")).as_py():
        stripped = pa.array([strip_credentials(u) for u in urls.to_pylist()], pa.string())
        if not stripped.equals(urls):
            log.warning("credentials embedded in shard URLs were left out of the saved index")
        urls = stripped
    near = relative(urls)
    if pc.any(near).as_py():
        urls = pc.if_else(near, pc.binary_join_element_wise(os.getcwd(), urls, "/"), urls)
    return with_base(table.set_column(0, "url", urls), "")


def write_table(
    f: Any,
    table: pa.Table,
    format: str | None,
    schemas: list[str],
    partitioning: str | None,
    compress: bool = False,
    relative_urls: str | None = None,
) -> None:
    """Write `table` to the binary file `f`, its metadata beside it (schemas as base64).
    `compress`: zstd-compressed buffers, for an index read whole over the network (a
    local one stays uncompressed, to be memory-mapped). `relative_urls`: the folder the
    index is saved in, to which the table's URLs are relative (an index saved beside its
    shards: loader.index.beside); loading takes the folder it is found in as their base."""
    doc = {
        "format_version": TABLE_VERSION,
        "format": format,
        "schemas": schemas,
        "partitioning": partitioning,
    }
    if relative_urls:
        doc["urls"], doc["folder"] = "relative", relative_urls
    meta = {b"shardstream": json.dumps(doc).encode()}
    table = table.replace_schema_metadata(meta)
    options = pa.ipc.IpcWriteOptions(compression="zstd" if compress else None)
    with pa.ipc.new_file(f, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))


def write_index(
    f: Any, index: Any, table: pa.Table, compress: bool, relative_urls: str | None = None
) -> None:
    """`write_table` of `table`, the index table of `index` (a ShardIndex: its format,
    Parquet schemas and partitioning go to the metadata) as it is to be saved."""
    parts = index.partitioning
    write_table(
        f,
        table,
        index.format,
        [schema_to_b64(s) for s in index.schemas],
        None if parts is None else schema_to_b64(parts),
        compress=compress,
        relative_urls=relative_urls,
    )


def read_table(source: Any, where: str) -> tuple[pa.Table, dict[str, Any]]:
    """(table, metadata) of a saved index (a path to memory-map, or a buffer); ValueError
    naming `where` when it is not one or of another version."""
    try:
        reader = pa.ipc.open_file(source)
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{redact(where)}: not a shardstream index ({e})") from e
    raw = (table.schema.metadata or {}).get(b"shardstream")
    if raw is None:
        raise ValueError(f"{redact(where)}: an Arrow file, but not a shardstream index")
    meta: dict[str, Any] = json.loads(raw)
    version = meta.get("format_version")
    if version != TABLE_VERSION:
        raise ValueError(
            f"{redact(where)}: index format version {version!r}, this shardstream reads "
            f"version {TABLE_VERSION} (and JSON version 2); rebuild the index with "
            "ShardIndex.build"
        )
    return table.replace_schema_metadata(None), meta
