"""Parquet shards: index from footers alone, read only the row groups and columns needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from ...columns.kinds import Kind, check_part
from ...errors import ShardError
from ...shard import Shard
from ...storage.filesystems import FileEntry, check_version, redact
from ...storage.ranges import PartsFile
from ...storage.retry import RetryPolicy, count_fetched, read_ranges
from ..deferred import complete, estimated_bytes, is_deferred
from ..partitions import check_hive_values, partition_arrays
from ..selected import pick, record_groups, stored_rows
from .blocks import Blocks
from .fetch import (
    Fetched,
    chunk_bytes,
    exact_fetcher,
    fetch_beside_footer,
    fetch_column_chunks,
    file_names,
    in_dataset_types,
    read_errors,
)
from .local import OpenFiles
from .meta import (
    FOOTERS,
    GROUP_BYTES,
    SCANS,
    TAIL,
    check_footer,
    column_ranges,
    footer_details,
    parse_footer,
    read_groups,
    row_groups,
)

__all__ = ["GROUP_BYTES", "ParquetFormat", "footer_details", "read_groups"]


class ParquetFormat(Blocks):
    """Parquet shards. For reading, `schema` is the schema of the asked columns every shard
    gives (ShardIndex.columns_schema), partition columns included (`partitioning`); with
    `kinds` (batch mode), each piece is made to fit its columns' kinds (loader.columns.kinds)."""

    name = "parquet"
    suffixes = (".parquet", ".parq", ".pq")

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        schema: pa.Schema | None = None,
        partitioning: pa.Schema | None = None,
        kinds: dict[str, Kind] | None = None,
        lengths: dict[str, int] | None = None,
        file_schemas: Sequence[pa.Schema] | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.schema = schema
        self.partitions = [] if partitioning is None else partitioning.names
        self.partitioning = partitioning
        self.kinds = kinds
        self.file_schemas = list(file_schemas or [])  # the index's: for memory estimates
        # plain list columns without a pad value: one row length, fixed by the first read
        self._fixed = [n for n, k in (kinds or {}).items() if k.ragged and k.pad is None]
        # plain list columns: the row length first read (shared by a mixture's streams)
        self._lengths: dict[str, int] = {} if lengths is None else lengths
        self._open_files = OpenFiles()  # per reading thread: the last files read
        self._targets: dict[tuple[str, ...], pa.Schema] = {}  # (see in_dataset_types)

    def scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        """One batched range read of each shard's last `TAIL` bytes (fsspec's cat_ranges
        runs them concurrently on S3); a second only for footers longer than that. Each read
        is of the listed version (an S3 object rewritten meanwhile is a StaleIndexError).
        A shard this process scanned before, at the same size and version, is not read
        again (`SCANS`: a dataset made again in one process, a notebook's, starts without
        its footers' reads and parsing, ~0.6 ms a shard)."""
        known = [SCANS.get((e.url, e.size, e.version)) if e.version else None for e in entries]
        todo = [e for e, got in zip(entries, known) if got is None]
        scanned = iter(self._scan(fs, todo) if todo else [])
        return [dict(got) if got is not None else next(scanned) for got in known]

    def _scan(self, fs: Any, entries: Sequence[FileEntry]) -> list[dict[str, Any]]:
        urls = [e.url for e in entries]
        sizes = [e.size for e in entries]
        indexed = [(e.size, e.version) for e in entries]
        starts = [max(0, n - TAIL) for n in sizes]
        tails = read_ranges(fs, urls, starts, sizes, self.retry, indexed)
        lengths = [check_footer(t[-8:], e) for t, e in zip(tails, entries)]
        longer = [i for i, (t, n) in enumerate(zip(tails, lengths)) if n + 8 > len(t)]
        if longer:
            more = read_ranges(
                fs,
                [urls[i] for i in longer],
                [sizes[i] - 8 - lengths[i] for i in longer],
                [sizes[i] for i in longer],
                self.retry,
                [indexed[i] for i in longer],
            )
            for i, footer in zip(longer, more):
                tails[i] = footer
        out = []
        for tail, n, e in zip(tails, lengths, entries):
            meta, details = footer_details(tail[len(tail) - n - 8 :], e.url)
            FOOTERS.put((e.url, e.size, e.version), meta, n + 8)
            if e.version:
                SCANS.put((e.url, e.size, e.version), details, n + 8)
            out.append(dict(details))
        return out

    def metadata(self, fs: Any, shard: Shard, footer: bytes | None = None) -> Any:
        """The shard's parsed footer: held in memory (FOOTERS), else `footer` (its bytes,
        of the indexed version) or the bytes read, parsed and then held."""
        key, size = (shard.url, shard.bytes, shard.version), shard.bytes
        meta = FOOTERS.get(key)
        if meta is None:
            n, indexed = shard.details["footer_bytes"], [(size, shard.version)]
            if footer is None:
                (footer,) = read_ranges(fs, [shard.url], [size - n], [size], self.retry, indexed)
            meta = parse_footer(footer)
            FOOTERS.put(key, meta, n)
        return meta

    def read(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> pa.Table:
        """Rows [start, stop) of the asked columns, in the dataset's column order and types,
        partition columns included: fetches the footer (once per shard and process) and
        only the column chunks of the asked columns in the row groups holding those rows.
        A shard that is no longer the indexed version raises StaleIndexError."""
        return self.decode(fs, self.fetch(fs, shard, start, stop, columns))

    def fetch(
        self,
        fs: Any,
        shard: Shard,
        start: int,
        stop: int,
        columns: Sequence[str] | None,
        chunks: bool = True,
    ) -> Fetched:
        """The storage part of `read`: the footer and (not local, `chunks`) the column
        chunks. Without `chunks`, a remote shard's chunks are read by the decode, each as
        pyarrow asks for it (`read_local`: a shard the node cache holds)."""
        return self.fetch_many(fs, shard, [(start, stop)], columns, chunks)[0]

    def fetch_many(
        self,
        fs: Any,
        shard: Shard,
        rows: Sequence[tuple[int, int]],
        columns: Sequence[str] | None,
        chunks: bool = True,
    ) -> list[Fetched]:
        """`fetch` of several row ranges of one shard, their column chunks read together:
        one coalesced set of ranged reads (fewer, larger requests), shared by all."""
        shard = complete(self, fs, shard)  # a shard only counted so far: its footer now
        names, cols = self._names(columns)
        got = []
        for start, stop in rows:
            first_row, groups = row_groups(shard, start, stop)
            got.append(Fetched(shard, start, stop, first_row, groups, names, cols))
        every = sorted({g for x in got for g in x.groups})
        local = isinstance(fs, LocalFileSystem)
        with read_errors(shard.url, every):
            remote = chunks and not local  # the chunks fetched here
            parts = fetch_beside_footer(self, fs, shard, every, cols) if remote else None
            meta = self.metadata(fs, shard)
            if parts is None and remote:
                parts = fetch_column_chunks(fs, shard, meta, every, cols, self.retry)
        for x in got:
            x.meta, x.parts, x.cached = meta, parts, not local and not chunks
        return got

    def stored_ranges(
        self, fs: Any, shard: Shard, start: int, stop: int, columns: Sequence[str] | None
    ) -> tuple[list[int], list[int]] | None:
        """(starts, ends): the byte ranges a read of rows [start, stop) of the asked columns
        fetches (its footer's column chunks); None for a shard whose footer this process
        does not hold (only counted so far, or not read yet): nothing is read here."""
        meta = None if is_deferred(shard) else FOOTERS.get((shard.url, shard.bytes, shard.version))
        if meta is None:
            return None
        _, groups = row_groups(shard, start, stop)
        _, cols = self._names(columns)
        with read_errors(shard.url, groups):
            starts, ends = column_ranges(shard.url, meta, groups, cols)
        limit = shard.bytes - int(shard.details["footer_bytes"])
        return starts, [min(e, limit) for e in ends]

    def _names(self, columns: Sequence[str] | None) -> tuple[list[str] | None, list[str] | None]:
        """(the columns a read gives, in order; those of them stored in the file: not
        partition keys). None: all."""
        names = list(columns) if columns is not None else None
        if names is None and self.schema is not None:
            names = self.schema.names
        cols = None if names is None else [c for c in names if c not in self.partitions]
        return names, cols

    def decode(
        self,
        fs: Any,
        got: Fetched,
        table: pa.Table | None = None,
        failed: BaseException | None = None,
    ) -> pa.Table:
        """The decoding part of `read`: local files are read by pyarrow's own file here
        (pre-buffered, coalesced; about 20% less CPU than bytes read through fsspec), or
        were read on a reading thread (`table`: `read_checked`'s rows of `got`'s row groups,
        the file's version checked there; loader.read.readahead), which this checks and
        shapes as its own reads. `failed`: that thread's read of a local file raised this,
        raised here as this read's own (named, explained by the version check), not read
        again (a damaged file's doomed read cost twice: 10 s each for one corpus file)."""
        url, groups, cols = got.shard.url, got.groups, got.cols
        with read_errors(url, groups):
            if got.cached:  # read through the node cache, which checks what it serves
                if table is None:  # (read again after a failure: the cache may heal it)
                    table = self.read_local(fs, got)
            elif got.parts is None:
                if table is None:  # (a reading thread's table was checked there)
                    try:
                        if failed is not None:
                            raise failed
                        table = self.read_local(fs, got)
                    finally:  # what was read is the indexed file (or a failure is explained)
                        check_version(fs, url, got.shard.bytes, got.shard.version)
                count_fetched(*chunk_bytes(got))  # the chunks read
            else:
                # pyarrow decodes from the fetched parts; a read outside them is fetched,
                # never zero-filled (loader.storage.ranges); the metadata we pass keeps it from
                # reading the footer again
                fetch = exact_fetcher(fs, got.shard, self.retry)
                f = PartsFile(url, got.shard.bytes, got.parts, fetch)
                table = pq.ParquetFile(f, metadata=got.meta).read_row_groups(
                    groups, columns=cols, use_threads=False
                )
        rows, d = stored_rows(got.shard.details), got.shard.details
        if table.num_rows != sum(rows[g] for g in groups):  # a damaged file: the pages hold
            raise ShardError(  # other counts than the footer says
                f"{redact(url)}: row groups {list(groups)} decode to {table.num_rows} rows, "
                f"the footer says {sum(rows[g] for g in groups)}: a damaged file"
            )
        part = pick(table, d, groups, got.start - got.first_row, got.stop - got.first_row)
        return self._shape(part, got.shard, got.names)

    def read_local(self, fs: Any, got: Fetched) -> pa.Table:
        """The rows of a local read's row groups as pyarrow reads them, unchecked (`decode`
        checks and shapes them): on any thread; each keeps its last few files open. A
        remote shard fetched without its chunks (`got.cached`) is read the same way through
        a file whose every read is a ranged read of the indexed version: inside
        `loader.storage.through.reading_shard`, from the node cache's checked blocks."""
        # one thread a read: several groups are decoded at once, and pyarrow's pool on
        # top only adds contention (measured slower)
        fetch = exact_fetcher(fs, got.shard, self.retry) if got.cached else None
        return self._open_files.read(fs, got.shard, got.meta, fetch, got.groups, got.cols)

    def cached_reading_ended(self) -> None:
        """A reading through the node cache ended: its shards' maps and files let go."""
        self._open_files.drop_cached()

    def read_checked(self, fs: Any, got: Fetched) -> pa.Table:
        """`read_local` on a reading thread, then a local file's version checked there
        (`decode` takes its table as checked): the consumer makes no system call for it (a
        stat releases the GIL, and the consumer then waits behind the reading thread to take
        it back: 0.1-0.3 ms a group, measured). A read that fails is not checked here: the
        consumer's `decode` raises its error, which it names and explains."""
        table = self.read_local(fs, got)
        if not got.cached:  # (the node cache checks what it serves)
            check_version(fs, got.shard.url, got.shard.bytes, got.shard.version)
        return table

    def _shape(self, table: pa.Table, shard: Shard, names: list[str] | None) -> pa.Table:
        """A piece as the dataset has it: the file's columns in the asked order, cast where
        another writer named or nulled them differently, partition values as columns, and
        (batch mode) each column fitted to its kind."""
        if self.schema is not None and names is not None:
            table = in_dataset_types(table, self.schema, shard.url, self._targets)
            inside = shard.details.get("hive_values")
            if inside:
                check_hive_values(table, inside, shard.url)
            values = shard.details.get("partitions") or {}
            asked = [c for c in names if c in self.partitions]
            for name, arr in partition_arrays(
                self.partitioning or pa.schema([]), values, table.num_rows, asked
            ).items():
                table = table.append_column(self.schema.field(name), arr)
            table = table if table.column_names == names else table.select(names)
        if self.kinds is not None:
            # plain list lengths are checked by `check`, in reading order (whichever thread
            # finished first must not decide a column's length), from the lengths `join`
            # measures
            table = check_part(table, self.kinds, shard.url)
        return table

    def piece_bytes(self, shard: Shard, start: int, stop: int) -> int:
        """Bytes of the row groups holding rows [start, stop), all columns."""
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop)
        _, groups = row_groups(shard, start, stop)
        return int(sum(shard.details["row_group_bytes"][g] for g in groups))

    def groups(self, shard: Shard) -> list[int]:
        """Records of each of the shard's read groups (see `read_groups`); a shard whose
        row groups the index does not know yet (deferred: a manifest's count) is one."""
        if is_deferred(shard):
            return [shard.num_records] if shard.num_records else []
        return record_groups(shard.details)

    def estimate(self, shard: Shard, start: int, stop: int, columns: Sequence[str] | None) -> int:
        """About how many bytes reading rows [start, stop) of the asked columns holds in
        memory: the row groups' uncompressed column chunks (from the index), else their
        stored bytes. Encoded pages can be smaller than the decoded columns (dictionaries),
        so the reader scales this by what it measured on the groups it decoded."""
        if is_deferred(shard):
            return estimated_bytes(shard, start, stop)
        _, groups = row_groups(shard, start, stop)
        d = shard.details
        plain, names = d.get("column_uncompressed_bytes"), file_names(shard, self.file_schemas)
        if plain is None or names is None:
            total = sum(d["row_group_bytes"][g] for g in groups)
        else:
            wanted = set(columns) if columns is not None else set(names)
            cols = [i for i, n in enumerate(names) if n in wanted]
            total = sum(plain[c][g] for c in cols for g in groups)
        rows = sum(d["row_group_rows"][g] for g in groups)
        return int(total * (stop - start) / rows) if rows else 0

    def reserve(self, nbytes: int) -> None:
        """A hint of the bytes the reader holds at most (unused: blocks are views)."""
