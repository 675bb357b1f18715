"""A write's state, kept in DEST so a killed write resumes: ``_progress.json`` (written
once, before any shard) holds what the write reads and makes (the source's identity, the
options, the layout); the shards whole so far are the shard files under their final
names (a shard is visible only when whole: write.shard). A write started again with the
same arguments keeps those, byte for byte, and writes the rest; other arguments, or files
in DEST that no write of ours made, are refused."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from shardstream.loader.index.beside import INDEX_NAME
from shardstream.loader.storage.filesystems import filesystem, is_local, redact

__all__ = ["PROGRESS", "check_progress", "found_shards", "leftovers"]

PROGRESS = "_progress.json"
_SHARD = re.compile(r"part-(\d{5,})\.parquet")
_OURS = {PROGRESS, INDEX_NAME, "_input"}


def _listing(dest: str, storage_options: dict[str, Any] | None) -> list[str]:
    """The names directly under `dest` (none where it does not exist)."""
    fs, path = filesystem(dest, storage_options)
    fs.invalidate_cache(path)
    try:
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
    except FileNotFoundError:
        return []


def check_progress(
    dest: str, storage_options: dict[str, Any] | None, doc: dict[str, Any]
) -> list[str]:
    """Start or resume the write `doc` describes in `dest`: the names found there.
    ValueError where `dest` holds another write's progress (naming what differs) or files
    that are not this write's; writes `doc` as the progress record where none is."""
    names = _listing(dest, storage_options)
    fs, path = filesystem(f"{dest}/{PROGRESS}", storage_options)
    if PROGRESS in names:
        with fs.open(path, "r") as f:
            old = json.load(f)
        differ = [k for k in doc if old.get(k) != doc[k]]
        if differ:
            raise ValueError(
                f"{redact(dest)} holds a write with other {', '.join(differ)} (its "
                f"{PROGRESS}): write to another folder, or remove it to start over"
            )
    else:
        foreign = [n for n in names if not n.startswith((".", "_"))]
        if foreign:
            raise ValueError(
                f"{redact(dest)} is not empty and holds no write of ours ({len(foreign)} "
                f"file(s), e.g. {foreign[0]}): write to an empty or new folder"
            )
        if is_local(fs):  # (an object store has no folders; a bucket is never made)
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "w") as f:
            json.dump(doc, f)
    return names


def found_shards(names: list[str], num_shards: int, dest: str) -> set[int]:
    """The shard numbers whole in `dest` (of a resumed write); ValueError for a file that
    is not one of its shards."""
    found = set()
    for name in names:
        if name.startswith((".", "_")) or name in _OURS:
            continue
        m = _SHARD.fullmatch(name)
        if m is None or int(m.group(1)) >= num_shards:
            raise ValueError(
                f"{redact(dest)}/{name}: not a shard of this write ({num_shards} shards): "
                "remove it, or write to another folder"
            )
        found.add(int(m.group(1)))
    return found


def leftovers(dest: str, storage_options: dict[str, Any] | None, names: list[str]) -> None:
    """Remove the hidden temporary files a killed local write left (``.part-*.tmp``)."""
    fs, path = filesystem(dest, storage_options)
    for name in names:
        if name.startswith(".part-") and name.endswith(".tmp"):
            fs.rm(f"{path}/{name}")
