"""ShardIndex: which shards, how many records each, and where their records lie."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .errors import ShardError, StaleIndexError
from .formats import format_for, format_of_url, known_suffixes
from .formats.parquet import schema_from_b64, schema_to_b64
from .retry import RetryPolicy, retrying
from .shard import Shard
from .storage import (
    FileEntry,
    UrlOrPath,
    as_url,
    entry_of,
    file_entry,
    filesystem,
    list_files,
    redact,
    strip_credentials,
)

__all__ = ["FORMAT_VERSION", "Shard", "ShardIndex"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INDEX_SUFFIXES = (".index.json", ".json")
SCAN_BATCH = 256  # shards whose footers or headers are read in one concurrent batch


def _discover(
    source: str | Sequence[str], storage_options: dict[str, Any] | None
) -> list[FileEntry]:
    """The shard files of a directory, prefix, glob or list, in a fixed order."""
    if isinstance(source, str):
        found = list_files(source, storage_options)
        entries = [e for e in found if format_of_url(e.url)]
        if not entries:
            raise FileNotFoundError(
                f"{redact(source)}: no shards found ({len(found)} files, none ending in "
                f"{known_suffixes()})"
            )
        if len(found) > len(entries):
            log.info("%s: ignoring %d non-shard files", redact(source), len(found) - len(entries))
        return entries
    urls = list(source)
    if not urls:
        raise ValueError("the list of shard URLs is empty")
    for url in urls:
        if not format_of_url(url):
            raise ValueError(
                f"{redact(url)}: unknown shard format; known suffixes: {known_suffixes()}"
            )
    return [file_entry(u, storage_options) for u in urls]


@dataclass
class ShardIndex:
    """The shards of a dataset, in a fixed order, with everything planning and reading need.

    A dataset has one format: mixing Parquet and tar shards raises ValueError, since their
    records have different shapes. Saved as JSON (never pickle) with a format version.
    """

    shards: list[Shard]
    schema: pa.Schema | None = None  # Parquet: the schema every shard shares

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        return np.array([s.num_records for s in self.shards], dtype=np.int64)

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def format(self) -> str | None:
        return self.shards[0].format if self.shards else None

    def __len__(self) -> int:
        return len(self.shards)

    @classmethod
    def build(
        cls,
        source: UrlOrPath | Sequence[UrlOrPath],
        storage_options: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
        retry: RetryPolicy | None = None,
    ) -> ShardIndex:
        """Index a directory, an s3:// prefix, a glob, a single file or a list of URLs.

        Reads only what indexing needs: the last 8 KiB of each Parquet shard, batched over
        shards (a second read where a footer is longer; the parsed footers stay cached in
        this process for reading), or one sequential pass over each tar's headers.
        `progress(done, total)` is called as shards are indexed; transient storage errors
        are retried as `retry` says. Paths (pathlib.Path) are taken as their strings.
        """
        source = as_url(source)
        retry = retry or RetryPolicy()
        where = source if isinstance(source, str) else "the listed shards"
        entries = retrying(where, retry, lambda: _discover(source, storage_options))
        formats = sorted({str(format_of_url(e.url)) for e in entries})
        if len(formats) > 1:
            examples = [next(e.url for e in entries if format_of_url(e.url) == f) for f in formats]
            raise ValueError(
                "mixed shard formats in one dataset: "
                + ", ".join(f"{f} ({redact(u)})" for f, u in zip(formats, examples))
                + "; index each format separately"
            )
        name = formats[0]
        fs, _ = filesystem(entries[0].url, storage_options)
        fmt = format_for(name, retry=retry)
        scanned: list[dict[str, Any]] = []
        for i in range(0, len(entries), SCAN_BATCH):
            scanned += fmt.scan(fs, entries[i : i + SCAN_BATCH])
            if progress is not None:
                progress(len(scanned), len(entries))
        shards = [
            Shard(e.url, name, int(s["num_records"]), e.size, e.version, s["details"])
            for e, s in zip(entries, scanned)
        ]
        schema = _common_schema(entries, scanned) if name == "parquet" else None
        log.info(
            "indexed %d %s shards, %d records",
            len(shards),
            name,
            sum(s.num_records for s in shards),
        )
        return cls(shards, schema)

    def bytes_for(self, shard: int, start: int, stop: int) -> int:
        """Bytes a reader fetches for rows [start, stop) of shard number `shard`."""
        if start >= stop:
            return 0
        s = self.shards[shard]
        return format_for(s.format).piece_bytes(s, start, stop)

    def to_json(self, keep_credentials: bool = False) -> dict[str, Any]:
        """The index as JSON-serializable data; URLs lose any embedded credentials unless
        `keep_credentials` (for handing the index to the job's other ranks, never saved)."""
        strip = (lambda u: u) if keep_credentials else strip_credentials
        shards = [{**asdict(s), "url": strip(s.url)} for s in self.shards]
        if any(d["url"] != s.url for d, s in zip(shards, self.shards)):
            log.warning("credentials embedded in shard URLs were left out of the saved index")
        return {
            "format_version": FORMAT_VERSION,
            "schema": None if self.schema is None else schema_to_b64(self.schema),
            "shards": shards,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str = "index") -> ShardIndex:
        version = doc.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{redact(where)}: index format version {version!r}, this shardstream reads "
                f"version {FORMAT_VERSION}; rebuild the index with ShardIndex.build"
            )
        schema = schema_from_b64(doc["schema"]) if doc.get("schema") else None
        return cls([Shard(**s) for s in doc["shards"]], schema)

    def save(self, url: UrlOrPath, storage_options: dict[str, Any] | None = None) -> None:
        """Write the index as JSON to a local path or URL. It holds no credentials."""
        url = as_url(url)
        fs, path = filesystem(url, storage_options)
        with fs.open(path, "w") as f:
            json.dump(self.to_json(), f)

    @classmethod
    def load(cls, url: UrlOrPath, storage_options: dict[str, Any] | None = None) -> ShardIndex:
        url = as_url(url)
        fs, path = filesystem(url, storage_options)
        try:
            with fs.open(path, "r") as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(url)}: no saved index there") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{redact(url)}: not a shardstream index ({e})") from e
        return cls.from_json(doc, url)

    def verify(self, storage_options: dict[str, Any] | None = None) -> None:
        """Raise StaleIndexError naming every shard whose size or version changed (or that
        disappeared) since the index was built."""
        stale = []
        for shard in self.shards:
            try:
                now: FileEntry | None = file_entry(shard.url, storage_options)
            except FileNotFoundError:
                now = None
            reason = stale_reason(shard, now)
            if reason:
                stale.append(reason)
        if stale:
            raise StaleIndexError(
                f"{len(stale)} shard(s) changed since the index was built: {'; '.join(stale[:5])}"
                + (" ..." if len(stale) > 5 else "")
                + ". Rebuild it with ShardIndex.build."
            )

    @classmethod
    def resolve(
        cls,
        source: Any,
        storage_options: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
        retry: RetryPolicy | None = None,
    ) -> ShardIndex:
        """A ShardIndex as given, a saved index (a path ending in .json), or a new build."""
        source = as_url(source)
        if isinstance(source, ShardIndex):
            return source
        if isinstance(source, str) and source.endswith(INDEX_SUFFIXES):
            return cls.load(source, storage_options)
        if isinstance(source, str | list | tuple):
            return cls.build(source, storage_options, progress, retry)
        raise ValueError(
            "source must be a URL, a list of URLs, a saved index or a ShardIndex, "
            f"got {type(source).__name__}"
        )


def stale_reason(shard: Shard, now: FileEntry | None) -> str | None:
    """Why `shard` no longer matches the file found now (None when it still does)."""
    if now is not None and now.size == shard.bytes and now.version == shard.version:
        return None
    found = "missing" if now is None else f"{now.size} bytes, version {now.version}"
    return (
        f"{redact(shard.url)} (indexed {shard.bytes} bytes, version {shard.version}; now {found})"
    )


_CHECKED: set[tuple[str, str | None]] = set()  # shards this process found unchanged


def check_unchanged(fs: Any, shard: Shard, retry: RetryPolicy | None = None) -> None:
    """Before a process first reads a shard: StaleIndexError if it changed since indexing
    (one stat or HEAD per shard and process)."""
    key = (shard.url, shard.version)
    if key in _CHECKED:
        return
    path = fs._strip_protocol(shard.url)
    try:
        info = retrying(shard.url, retry or RetryPolicy(), lambda: fs.info(path))
        now: FileEntry | None = entry_of(fs, info)
    except FileNotFoundError:
        now = None
    reason = stale_reason(shard, now)
    if reason:
        raise StaleIndexError(f"{reason}: the shard changed since the index was built; rebuild it")
    _CHECKED.add(key)


def _common_schema(
    entries: Sequence[FileEntry], scanned: Sequence[dict[str, Any]]
) -> pa.Schema | None:
    """The schema every Parquet shard shares; ValueError naming the first that differs."""
    if not scanned:
        return None
    first = schema_from_b64(scanned[0]["schema"])
    for entry, s in zip(entries[1:], scanned[1:]):
        if s["schema"] == scanned[0]["schema"]:
            continue
        other = schema_from_b64(s["schema"])
        if not other.equals(first, check_metadata=False):
            raise ShardError(
                f"{redact(entry.url)}: schema differs from {redact(entries[0].url)}'s: "
                f"{_schema_diff(first, other)}; all shards of a dataset must share one schema"
            )
    return first


def _schema_diff(a: pa.Schema, b: pa.Schema) -> str:
    fa, fb = {f.name: str(f.type) for f in a}, {f.name: str(f.type) for f in b}
    parts = [
        f"{n}: {fa.get(n, 'absent')} vs {fb.get(n, 'absent')}"
        for n in sorted(fa.keys() | fb.keys())
        if fa.get(n) != fb.get(n)
    ]
    return ", ".join(parts) or "field order or nullability"
