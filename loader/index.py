"""ShardIndex: which shards, how many records each, and where their records lie."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .build import assemble, discover, scan
from .errors import StaleIndexError
from .formats import format_for
from .formats.parquet_meta import schema_from_b64, schema_to_b64
from .hf import check_hf_rows, hf_files
from .retry import RetryPolicy
from .schemas import select_schema, unify_schemas
from .shard import Shard
from .storage import (
    FileEntry,
    UrlOrPath,
    as_url,
    file_entry,
    filesystem,
    redact,
    stale_reason,
    strip_credentials,
)

__all__ = ["FORMAT_VERSION", "Shard", "ShardIndex"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
INDEX_SUFFIXES = (".index.json", ".json")


@dataclass
class ShardIndex:
    """The shards of a dataset, in a fixed order, with everything planning and reading need.

    A dataset has one format: mixing Parquet and tar shards raises ValueError, since their
    records have different shapes (``.tar``, ``.tar.gz`` and ``.tgz`` are one format).
    Parquet shards may differ in schema (see loader.schemas): `schemas` holds each distinct
    one and a shard's ``details["schema"]`` its number; `partitioning` the Hive partition
    fields, whose values each shard's ``details["partitions"]`` holds. Saved as JSON
    (never pickle) with a format version.
    """

    shards: list[Shard]
    schemas: list[pa.Schema] = field(default_factory=list)  # Parquet: distinct file schemas
    partitioning: pa.Schema | None = None  # Hive partition fields, when the tree has them

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        return np.array([s.num_records for s in self.shards], dtype=np.int64)

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def format(self) -> str | None:
        return self.shards[0].format if self.shards else None

    @property
    def schema(self) -> pa.Schema | None:
        """Parquet: every column of any shard (loader.schemas.unify_schemas), then the
        partition fields; None for tar."""
        if not self.schemas:
            return None
        schema = unify_schemas(self.schemas)
        for f in self.partitioning or []:
            schema = schema.append(f)
        return schema

    def columns_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of the asked columns (all when None) that every shard can give:
        ValueError for an unknown column, ShardError naming the shard, the column and both
        types where a shard lacks it or holds another type (loader.schemas)."""
        parts = self.partitioning or pa.schema([])
        asked = None if columns is None else [c for c in columns if c not in parts.names]
        # a schema only shards without records have is never read: it cannot conflict
        read = {s.details.get("schema", 0) for s in self.shards if s.num_records > 0}
        numbers = [i for i in range(len(self.schemas)) if i in read] or list(
            range(len(self.schemas))
        )
        examples = {}
        for s in reversed(self.shards):
            examples[s.details.get("schema", 0)] = s.url
        files = select_schema(
            [self.schemas[i] for i in numbers], [examples.get(i, "") for i in numbers], asked
        )
        wanted = files.names + parts.names if columns is None else list(columns)
        by_name = {f.name: f for f in [*files, *parts]}
        return pa.schema([by_name[n] for n in wanted])

    def __len__(self) -> int:
        return len(self.shards)

    @classmethod
    def build(
        cls,
        source: UrlOrPath | Sequence[UrlOrPath],
        storage_options: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
        retry: RetryPolicy | None = None,
        listed: Callable[[int], None] | None = None,
        sidecars: bool = True,
    ) -> ShardIndex:
        """Index a directory, an s3:// prefix, a glob, a single file, a list of URLs or a
        manifest (loader.manifest).

        Reads only what indexing needs: the last 8 KiB of each Parquet shard, batched over
        shards (a second read where a footer is longer; the parsed footers stay cached in
        this process for reading); for a tar shard its DALI ``.idx`` sidecar if one lies
        beside it (checked against the shard), else its headers (sequential reads, or one
        small read per header where members are large; decompressing a ``.tar.gz``);
        nothing for shards whose record counts a manifest or a wids shard list gives (their
        readers index them when they open them). Below a directory, ``key=value`` folders
        of Parquet shards become partition columns (loader.partitions). `listed(n)` follows
        the listing, `progress(done, total)` the indexing; transient storage errors are
        retried as `retry` says; `sidecars=False` ignores sidecars and wids lists.
        Paths (pathlib.Path) are taken as their strings. Under torch.distributed,
        loader.distributed_index shares this work among ranks.
        """
        source = as_url(source)
        retry = retry or RetryPolicy()
        listing = discover(source, storage_options, retry, listed, sidecars)
        scanned = scan(listing, storage_options, retry, progress)
        return cls(*assemble(listing, scanned, storage_options))

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
            "schemas": [schema_to_b64(s) for s in self.schemas],
            "partitioning": None if self.partitioning is None else schema_to_b64(self.partitioning),
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
        schemas = [schema_from_b64(s) for s in doc.get("schemas", [])]
        parts = doc.get("partitioning")
        partitioning = schema_from_b64(parts) if parts else None
        return cls([Shard(**s) for s in doc["shards"]], schemas, partitioning)

    def save(self, url: UrlOrPath, storage_options: dict[str, Any] | None = None) -> None:
        """Write the index as JSON to a local path or URL. It holds no credentials, and
        relative local shard paths are saved absolute (the index may be loaded elsewhere)."""
        url = as_url(url)
        fs, path = filesystem(url, storage_options)
        doc = self.to_json()
        for shard in doc["shards"]:
            if "://" not in shard["url"] and not os.path.isabs(shard["url"]):
                shard["url"] = os.path.abspath(shard["url"])
        with fs.open(path, "w") as f:
            json.dump(doc, f)

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
        if isinstance(doc, dict) and "shardlist" in doc:
            raise ValueError(
                f"{redact(url)}: a wids shard list, not a shardstream index: give the folder "
                "holding it and its shards as the source (its record counts are used), or "
                "write a manifest (see loader.manifest)"
            )
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
            reason = stale_reason(shard.url, shard.bytes, shard.version, now)
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
        """A ShardIndex as given, a saved index (a path ending in .json), a
        ``datasets.Dataset`` (its Arrow files, see loader.hf), or a new build."""
        source = as_url(source)
        if isinstance(source, ShardIndex):
            return source
        files = hf_files(source)
        if files is not None:  # a datasets.Dataset: its Arrow files
            index = cls.build(files, None, progress, retry)
            check_hf_rows(source, index.columns_schema(None).names, index.num_records)
            return index
        if isinstance(source, str) and source.endswith(INDEX_SUFFIXES):
            return cls.load(source, storage_options)
        if isinstance(source, str | list | tuple):
            return cls.build(source, storage_options, progress, retry)
        raise ValueError(
            "source must be a URL, a list of URLs, a saved index or a ShardIndex, "
            f"got {type(source).__name__}"
        )
