"""An index saved beside the shards it indexes, as ``shardstream.write_shards`` leaves it:
``FOLDER/_shardstream.index.arrow`` (a hidden name: listings skip it), an Arrow index
(loader.index.saved) whose URLs are relative to its folder, so the folder can be moved
or copied to another store whole. ``StreamingDataset(FOLDER)`` finds it (`fetch_beside`:
one request) and lists nothing and reads no footer; each shard's size and version are in
it, and every read checks them (a shard rewritten since is a StaleIndexError naming it).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import fsspec
import pyarrow as pa

from ..formats import format_of_url
from ..storage.filesystems import filesystem, is_local, redact, strip_credentials
from ..storage.listing import list_ahead
from ..storage.trips import trip, trip_to
from .manifest import is_manifest
from .saved import write_index
from .urls import table_urls, with_base

__all__ = ["INDEX_NAME", "fetch_beside", "relocated", "save_beside"]

log = logging.getLogger(__name__)

INDEX_NAME = "_shardstream.index.arrow"


def save_beside(index: Any, url: str, storage_options: dict[str, Any] | None) -> None:
    """Save `index` (a ShardIndex) at `url` (``FOLDER/_shardstream.index.arrow``), its
    URLs relative to FOLDER; ValueError for a shard outside FOLDER. Local: written under
    a hidden name and renamed; an object store's upload is visible only when complete."""
    folder = url.rsplit("/", 1)[0]
    urls = table_urls(index.table).to_pylist()
    outside = [u for u in urls if not u.startswith(folder + "/")]
    if outside:
        raise ValueError(f"{redact(outside[0])} is not below {redact(folder)}")
    names = pa.array([u[len(folder) + 1 :] for u in urls], pa.string())
    table = index.table.set_column(0, "url", names).replace_schema_metadata(None)
    fs, path = filesystem(url, storage_options)
    local = is_local(fs)
    target = f"{os.path.dirname(path)}/.{INDEX_NAME}.{uuid.uuid4().hex[:8]}.tmp" if local else path
    with trip_to(fs), fs.open(target, "wb") as f:
        write_index(f, index, table, compress=not local, relative_urls=_where(folder))
    if local:
        os.replace(target, path)


def _where(folder: str) -> str:
    """`folder` as compared when loading: local paths absolute, no credentials."""
    return os.path.abspath(folder) if "://" not in folder else strip_credentials(folder)


def relocated(table: pa.Table, meta: dict[str, Any], url: str) -> pa.Table:
    """The table of an index saved beside its shards, loaded from `url`: its URLs relative
    to the folder it is in now. Found where it was written, every read checks each shard's
    version; found elsewhere (the folder copied or moved: a copy changes modification
    times and inodes, another store has its own ETags), the sizes are checked, not the
    versions."""
    folder = url.rsplit("/", 1)[0]
    table = with_base(table, folder)
    if meta.get("folder") != _where(folder):
        log.info("%s: the index was written in another folder: shard sizes are checked, not "
                 "versions", redact(url))  # fmt: skip
        at = table.schema.get_field_index("version")
        nulls = pa.nulls(table.num_rows, pa.string())
        table = table.set_column(at, table.schema.field(at), nulls)
    return table


def fetch_beside(
    source: object, storage_options: dict[str, Any] | None
) -> tuple[str, bytes | None] | None:
    """(URL, bytes) of the index beside the shards of `source` where it is a folder or
    prefix holding one; None otherwise (a file, glob, list, manifest or saved index, or a
    folder without one). The bytes are None for a local file (loaded memory-mapped). On
    object stores one ranged GET, which is also the load: a HEAD (s3fs's info, which lists
    the prefix as well when nothing is there) and a GET after it would be three round trips
    in line. On S3, GCS and Azure the prefix's listing is sent beside it (`list_ahead`), for
    the build that follows where none is there; dropped where one is."""
    if not isinstance(source, str) or fsspec.core.has_magic(source) or is_manifest(source):
        return None
    if format_of_url(source) or source.lower().endswith((".json", ".arrow")):
        return None
    url = f"{source.rstrip('/')}/{INDEX_NAME}"
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        return (url, None) if os.path.isfile(path) else None
    drop = list_ahead(source, storage_options)  # for the build if none is there
    try:
        with trip():
            got = fs.cat_file(path, start=0)
    except Exception:  # none there, or the store refuses: the build that follows names why
        return None
    drop()
    return url, got
