"""ShardIndex: which shards, how many records each, and where their records lie."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..errors import StaleIndexError
from ..formats import format_for
from ..formats.parquet.meta import schema_from_b64, schema_to_b64
from ..formats.schemas import select_schema, unify_schemas
from ..shard import Shard
from ..storage.filesystems import (
    FileEntry,
    UrlOrPath,
    as_url,
    filesystem,
    is_local,
    redact,
    stale_reason,
    strip_credentials,
)
from ..storage.listing import file_entry
from ..storage.retry import RetryPolicy
from ..storage.trips import trip, trip_to
from .beside import fetch_beside, relocated
from .build import assemble, discover, scan
from .hf import check_hf_rows, hf_files
from .listing import Listing
from .saved import ARROW_MAGIC, portable, read_table, write_index
from .table import ShardList, layout_columns, numbers, one_array, plain, shard_table
from .urls import base_of, is_relative, table_urls

__all__ = ["FORMAT_VERSION", "Shard", "ShardIndex"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
INDEX_SUFFIXES = (".index.arrow", ".index.json", ".json")


class ShardIndex:
    """The shards of a dataset, in a fixed order, with everything planning and reading need.

    Held as columns (loader.index.table): `table` has a row a shard (url, bytes, version,
    records, and the layout a reader needs: Parquet row groups, tar member ranges), so a
    million shards are a few arrays; `shards[i]` is shard i as a `Shard` (made when asked
    for) and `shard_sizes` the records of all as one array. A dataset has one format:
    mixing Parquet and tar shards raises ValueError, since their records have different
    shapes (``.tar``, ``.tar.gz`` and ``.tgz`` are one format). Parquet shards may differ
    in schema (see loader.formats.schemas): `schemas` holds each distinct one and a shard's
    ``details["schema"]`` its number; `partitioning` the Hive partition fields, whose
    values each shard's ``details["partitions"]`` holds. Saved as an Arrow IPC file (or
    JSON, for a path ending in .json; never pickle) with a format version.
    """

    def __init__(
        self,
        shards: Sequence[Shard] = (),
        schemas: Sequence[pa.Schema] = (),
        partitioning: pa.Schema | None = None,
        *,
        table: pa.Table | None = None,
        format: str | None = None,
    ) -> None:
        if table is None:
            formats = sorted({s.format for s in shards})
            if len(formats) > 1:
                raise ValueError(f"mixed shard formats in one index: {formats}")
            format = formats[0] if formats else format
            table = shard_table(
                pa.array([s.url for s in shards], pa.string()),
                [s.bytes for s in shards],
                pa.array([s.version for s in shards], pa.string()),
                [s.num_records for s in shards],
                layout_columns([s.details for s in shards]),
            )
        self.table = table
        self._format = format
        self.schemas = list(schemas)  # Parquet: distinct file schemas
        self.partitioning = partitioning  # Hive partition fields, when the tree has them
        self.shards = ShardList(table, format or "")
        # (S,) records of each shard: a read-only view of the table's column
        self._sizes: npt.NDArray[np.int64] = numbers(table.column("records"))

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        """(S,) records of each shard (a copy)."""
        return self._sizes.copy()

    @property
    def num_records(self) -> int:
        return int(self._sizes.sum())

    @property
    def format(self) -> str | None:
        return self._format if len(self) else None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to DataLoader workers, to other ranks) as its table: Arrow buffers."""
        return {
            "table": self.table,
            "format": self._format,
            "schemas": self.schemas,
            "partitioning": self.partitioning,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            schemas=state["schemas"],
            partitioning=state["partitioning"],
            table=state["table"],
            format=state["format"],
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        same_base = base_of(self.table) == base_of(other.table)
        return (
            self._format == other._format
            and (
                self.table.equals(other.table)
                if same_base
                else table_urls(self.table).equals(table_urls(other.table))
                and self.table.drop_columns(["url"]).equals(other.table.drop_columns(["url"]))
            )
            and self.schemas == other.schemas
            and self.partitioning == other.partitioning
        )

    def __repr__(self) -> str:
        return f"ShardIndex({len(self)} {self._format} shards, {self.num_records} records)"

    @property
    def schema(self) -> pa.Schema | None:
        """Parquet: every column of any shard (loader.formats.schemas.unify_schemas), then the
        partition fields; None for tar."""
        if not self.schemas:
            return None
        schema = unify_schemas(self.schemas)
        for f in self.partitioning or []:
            schema = schema.append(f)
        return schema

    def _schema_numbers(self) -> npt.NDArray[np.int64]:
        """(S,) each shard's schema number (0 where the index has none: deferred)."""
        if "schema" not in self.table.column_names:
            return np.zeros(len(self), dtype=np.int64)
        return numbers(self.table.column("schema")).astype(np.int64)

    def columns_schema(self, columns: Sequence[str] | None) -> pa.Schema:
        """The schema of the asked columns (all when None) that every shard can give:
        ValueError for an unknown column, ShardError naming the shard, the column and both
        types where a shard lacks it or holds another type (loader.formats.schemas)."""
        parts = self.partitioning or pa.schema([])
        asked = None if columns is None else [c for c in columns if c not in parts.names]
        numbers_of = self._schema_numbers()
        # a schema only shards without records have is never read: it cannot conflict (not
        # np.unique: it imports numpy.ma, ~7 ms of a first construction)
        read = set(np.flatnonzero(np.bincount(numbers_of[self._sizes > 0])).tolist())
        every = range(len(self.schemas))
        numbers = [i for i in every if i in read] or list(every)
        # an example shard of each schema: its first
        firsts = {}
        if len(self):
            uniq, first = np.unique(numbers_of, return_index=True)
            firsts = dict(zip(uniq.tolist(), first.tolist()))
        examples = [self.shards[firsts[i]].url if i in firsts else "" for i in numbers]
        files = select_schema([self.schemas[i] for i in numbers], examples, asked)
        wanted = files.names + parts.names if columns is None else list(columns)
        by_name = {f.name: f for f in [*files, *parts]}
        return pa.schema([by_name[n] for n in wanted])

    def __len__(self) -> int:
        return len(self._sizes)

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
        manifest (loader.index.manifest).

        Reads only what indexing needs: the last 8 KiB of each Parquet shard, batched over
        shards (a second read where a footer is longer; the parsed footers stay cached in
        this process for reading); for a tar shard its DALI ``.idx`` sidecar if one lies
        beside it (checked against the shard), else its headers (sequential reads, or one
        small read per header where members are large; decompressing a ``.tar.gz``);
        nothing for shards whose record counts a manifest or a wids shard list gives (their
        readers index them when they open them). Below a directory, ``key=value`` folders
        of Parquet shards become partition columns (loader.formats.partitions). `listed(n)` follows
        the listing, `progress(done, total)` the indexing; transient storage errors are
        retried as `retry` says; `sidecars=False` ignores sidecars and wids lists.
        Paths (pathlib.Path) are taken as their strings. Under torch.distributed,
        loader.index.distributed shares this work among ranks.
        """
        source = as_url(source)
        retry = retry or RetryPolicy()
        listing = discover(source, storage_options, retry, listed, sidecars)
        scanned = scan(listing, storage_options, retry, progress)
        return cls.assembled(listing, scanned, storage_options)

    @classmethod
    def assembled(
        cls,
        listing: Listing,
        scanned: Sequence[dict[str, Any] | None],
        storage_options: dict[str, Any] | None,
    ) -> ShardIndex:
        """The index of a scanned listing (loader.index.build.assemble)."""
        table, schemas, partitioning = assemble(listing, scanned, storage_options)
        return cls(schemas=schemas, partitioning=partitioning, table=table, format=listing.format)

    def bytes_for(self, shard: int, start: int, stop: int) -> int:
        """Bytes a reader fetches for rows [start, stop) of shard number `shard`."""
        if start >= stop:
            return 0
        s = self.shards[shard]
        return format_for(s.format).piece_bytes(s, start, stop)

    def _list_sums(self, name: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        """(per shard: the sum of list column `name`'s values, its length), or None when
        no shard has the column (nulls sum to 0, of length 0)."""
        if name not in self.table.column_names:
            return None
        col = one_array(self.table.column(name))
        offsets = numbers(col.offsets).astype(np.int64)
        total = np.concatenate(([0], np.cumsum(numbers(col.values))))
        return total[offsets[1:]] - total[offsets[:-1]], np.diff(offsets)

    def stored_bytes(self) -> int:
        """Bytes reading every shard once, whole, fetches (its row groups, its tar members'
        span; a shard indexed only by a count: its size): what the planner compares the
        ranks' reads against. Columnar formats in one pass over the index's columns."""
        sums = self._list_sums("row_group_bytes")
        if self._format in ("parquet", "arrow") and sums is not None:
            scanned = sums[1] > 0
            sizes = numbers(self.table.column("bytes"))
            return int(np.where(scanned, sums[0], np.where(self._sizes > 0, sizes, 0)).sum())
        return sum(self.bytes_for(i, 0, int(n)) for i, n in enumerate(self._sizes.tolist()))

    def single_group_shards(self) -> int:
        """Parquet shards of more than one record in a single row group (a reader of any
        of their records reads all of it)."""
        sums = self._list_sums("row_group_rows")
        if sums is None:
            return 0
        return int(((sums[1] == 1) & (self._sizes > 1)).sum())

    def to_json(self, keep_credentials: bool = False) -> dict[str, Any]:
        """The index as JSON-serializable data; URLs lose any embedded credentials unless
        `keep_credentials` (for handing the index to the job's other ranks, never saved)."""
        strip = (lambda u: u) if keep_credentials else strip_credentials
        shards = [
            {**asdict(replace(s, details={})), "details": plain(s.details), "url": strip(s.url)}
            for s in self.shards
        ]
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
        """Write the index to a local path or URL: an Arrow IPC file (loader.index.saved;
        name it ``*.index.arrow``), or JSON where the path ends in ``.json``. It holds no
        credentials, and relative local shard paths are saved absolute (the index may be
        loaded elsewhere)."""
        url = as_url(url)
        fs, path = filesystem(url, storage_options)
        if url.lower().endswith(".json"):
            doc = self.to_json()
            for shard in doc["shards"]:
                if is_relative(shard["url"]):  # (as `portable` finds them)
                    shard["url"] = os.path.abspath(shard["url"])
            with trip_to(fs), fs.open(path, "w") as f:
                json.dump(doc, f)
            return
        table = portable(self.table.set_column(0, "url", table_urls(self.table)))
        with trip_to(fs), fs.open(path, "wb") as f:
            write_index(f, self, table, compress=not is_local(fs))

    @classmethod
    def load(
        cls, url: UrlOrPath, storage_options: dict[str, Any] | None = None, data: Any = None
    ) -> ShardIndex:
        """A saved index: an Arrow IPC one (memory-mapped when local) or a JSON one.
        `data`: its bytes where they were fetched already (loader.index.beside)."""
        url = as_url(url)
        fs, path = filesystem(url, storage_options)
        try:
            if data is not None:
                arrow = bytes(data[: len(ARROW_MAGIC)]) == ARROW_MAGIC
            elif is_local(fs):
                with fs.open(path, "rb") as f:
                    arrow, data = f.read(len(ARROW_MAGIC)) == ARROW_MAGIC, None
            else:  # one ranged GET: a whole-object cat_file (or open) asks the size first
                with trip():
                    data = fs.cat_file(path, start=0)
                arrow = data.startswith(ARROW_MAGIC)
        except FileNotFoundError:
            raise FileNotFoundError(f"{redact(url)}: no saved index there") from None
        if arrow:
            source = pa.memory_map(path) if data is None else pa.py_buffer(data)
            table, meta = read_table(source, url)
            if meta.get("urls") == "relative":  # beside its shards (loader.index.beside)
                table = relocated(table, meta, url)
            parts = meta.get("partitioning")
            return cls(
                schemas=[schema_from_b64(t) for t in meta.get("schemas", [])],
                partitioning=schema_from_b64(parts) if parts else None,
                table=table,
                format=meta.get("format"),
            )
        try:
            doc = json.loads(data if data is not None else fs.cat_file(path))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{redact(url)}: not a shardstream index ({e})") from e
        if isinstance(doc, dict) and "shardlist" in doc:
            raise ValueError(
                f"{redact(url)}: a wids shard list, not a shardstream index: give the folder "
                "holding it and its shards as the source (its record counts are used), or "
                "write a manifest (see loader.index.manifest)"
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
                f"{' ...' if len(stale) > 5 else ''}. Rebuild it with ShardIndex.build."
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
        ``datasets.Dataset`` (its Arrow files, see loader.index.hf), or a new build."""
        source = as_url(source)
        if isinstance(source, ShardIndex):
            return source
        files = hf_files(source)
        if files is not None:  # a datasets.Dataset: its Arrow files
            index = cls.build(files, None, progress, retry)
            check_hf_rows(source, index.columns_schema(None).names, index.num_records)
            return index
        if str(source).endswith(INDEX_SUFFIXES):
            return cls.load(source, storage_options)
        if beside := fetch_beside(source, storage_options):  # (loader.index.beside)
            return cls.load(beside[0], storage_options, beside[1])
        if isinstance(source, str | list | tuple):
            return cls.build(source, storage_options, progress, retry)
        raise ValueError(f"source must be a URL, URLs, a saved index or a ShardIndex: {source!r}")
