"""Local Parquet read groups decoded by pyarrow's dataset scanner, on pyarrow's own threads.

A reading of local Parquet shards (loader.read.reading) hands the groups it starts here,
in reading order. Runs of them become one scan: a pyarrow dataset of one fragment a group
(the file's fragment narrowed to the group's row groups), scanned in order with a small
readahead. The scan decodes in Arrow's C++ thread pool, which never takes Python's GIL, so
decoding runs beside the consumer's Python work instead of inside it (measured on 2 cores:
one-row-group fragments scan at 1.6-1.9x the records/s of a plain `iter_batches` loop, at
1.1-1.2x its CPU; a Python thread calling `read_row_groups` gained nothing, as it takes the
GIL back after every call).

What the scan yields is checked and shaped by the format as its own reads are
(`ParquetFormat.decode` with the table: row counts against the footer, the file's version,
casts, partition columns, kinds). Each batch is tagged with its fragment: a batch of
other row groups than the group expected, or a count other than the footer's, is a
ShardError naming the shard. When a scan raises, the error may belong to a group the
scan read ahead, so the groups left are read one by one by the format itself from then
on: each error then names its own shard and row groups.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from ..errors import ShardError, redact
from ..formats.parquet_fetch import read_errors
from ..stats import active
from ..storage.filesystems import check_version
from .groups import Group, GroupReader, finish

__all__ = ["READAHEAD", "Scans", "fragment", "scannable"]

READAHEAD = 2  # groups a scan decodes ahead of the one the consumer waits for (with the
# one being decoded: 2 cores busy; more held decoded groups and read no faster)


OPEN_FILES = 16  # files whose fragments (footers parsed) a thread keeps for their next groups
_FRAGMENTS = threading.local()


def scannable(fmt: Any) -> bool:
    """Whether a format's local shards are scanned: Parquet's (Arrow IPC shards, read
    from checked frames, are not)."""
    return getattr(fmt, "name", None) == "parquet"


def fragment(fs: Any, got: Any) -> tuple[Any, pa.Schema]:
    """(A pyarrow dataset fragment of the row groups a local Parquet read `got` reads, the
    file's schema). The file's fragment, its footer parsed, is kept for the file's next
    groups. A file that is not the indexed version is a StaleIndexError; other failures
    name the shard and row groups."""
    with read_errors(got.shard.url, got.groups):
        try:
            return _fragment(got)
        except Exception:
            check_version(fs, got.shard.url, got.shard.bytes, got.shard.version)
            raise


def _fragment(got: Any) -> tuple[Any, pa.Schema]:
    import pyarrow.dataset as pds  # imports pandas when installed (~0.2 s): on first use

    key = (got.shard.url, got.shard.bytes, got.shard.version)
    frags: OrderedDict[Any, Any] | None = getattr(_FRAGMENTS, "d", None)
    if frags is None:
        frags = _FRAGMENTS.d = OrderedDict()
    whole = frags.get(key)
    if whole is None:
        path = LocalFileSystem._strip_protocol(got.shard.url)
        whole = pds.ParquetFileFormat().make_fragment(path, filesystem=_local_arrow_fs())
        frags[key] = whole
        while len(frags) > OPEN_FILES:
            frags.popitem(last=False)
    frags.move_to_end(key)
    return whole.subset(row_group_ids=list(got.groups)), whole.physical_schema


@functools.cache
def _local_arrow_fs() -> Any:
    """pyarrow's local filesystem (one for the process: it holds no state)."""
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


class _Scan:
    """One scan: its batches, and its groups not complete yet, in order, each with what it
    reads (the format's fetch) and the rows its footer gives it."""

    __slots__ = ("batches", "groups")

    def __init__(self, batches: Iterator[Any], groups: collections.deque[_Item]) -> None:
        self.batches, self.groups = batches, groups


_Item = tuple[Group, Any, int]  # (group, its fetch, its rows by the footer)


class Scans:
    """The groups of one reading that scans decode: queued in reading order (`add`),
    decoded in that order as the consumer waits for them (`until`). A scan starts as soon
    as groups are queued and fewer than READAHEAD wait undecoded in the scans under way,
    so the next scan decodes while the consumer takes the end of the last (a mixture's
    small stream gets its groups one at a time: each waits decoded, not started)."""

    def __init__(self, reader: GroupReader, fs: Any) -> None:
        self.reader, self.fs = reader, fs
        self.queue: collections.deque[Group] = collections.deque()  # not in a scan yet
        self.scans: collections.deque[_Scan] = collections.deque()  # under way, in order
        self.left: collections.deque[_Item] = collections.deque()  # after a failed scan
        self.got: list[Any] = []  # the batches of the first scan's first group so far
        self.rows = 0  # their rows
        self.broken = False  # a scan failed: every group left is read by the format

    def add(self, entries: list[Group]) -> None:
        """Groups started, in reading order: a scan starts on them if the scans under way
        are near their end."""
        self.queue.extend(entries)
        self._top_up()

    def drop(self, entry: Group) -> None:
        """`entry` is let go: if no scan has it yet, its reading ends now (unread); a scan's
        group is discarded when decoded (`entry.dropped`)."""
        if entry in self.queue:
            self.queue.remove(entry)
            finish(entry, None)

    def until(self, entry: Group) -> None:
        """Decode groups in reading order until `entry`'s reading is over."""
        while not entry.future.done():
            if self.broken:
                self._one_by_one()
            elif self.scans:
                self._next_batch()
            elif self.queue:
                self._start()
            else:
                raise RuntimeError("a group waited for is in no scan")  # never: `add` first

    def close(self) -> None:
        """Stop: the groups not decoded end unread (their budget is refunded by their
        owner's callbacks)."""
        items = [i for scan in self.scans for i in scan.groups] + list(self.left)
        for entry in [e for e, _, _ in items] + list(self.queue):
            if not entry.future.done():
                finish(entry, None)
        self.scans.clear()
        self.left.clear()
        self.queue.clear()

    def _top_up(self) -> None:
        """Start a scan of the queued groups if fewer than READAHEAD groups wait in the
        scans under way."""
        if self.broken or not self.queue:
            return
        if sum(len(scan.groups) for scan in self.scans) <= READAHEAD:
            self._start()

    def _start(self) -> None:
        """A scan of the queued groups (up to the first whose file has another schema):
        each group's row groups are found from the index and footer first (`fetch`: a
        failure there is that group's error, when the consumer reaches it)."""
        items: collections.deque[_Item] = collections.deque()
        frags: list[Any] = []
        schema: pa.Schema | None = None
        while self.queue:
            entry = self.queue[0]
            try:
                got = self._fetch(entry)
                frag, file_schema = fragment(self.fs, got)
            except Exception as e:
                if frags:  # the scan so far first; this group's error when reached
                    break
                self.queue.popleft()
                finish(entry, None, e)
                return
            if schema is not None and not file_schema.equals(schema):
                break  # one scan, one file schema (the format casts what differs)
            schema = file_schema
            self.queue.popleft()
            items.append((entry, got, _footer_rows(got)))
            frags.append(frag)
        if not frags:
            return
        import pyarrow.dataset as pds

        dataset = pds.FileSystemDataset(frags, schema, pds.ParquetFileFormat(), frags[0].filesystem)
        scanner = dataset.scanner(
            columns=items[-1][1].cols,  # the asked columns stored in the files
            batch_size=1 << 30,  # a row group is one batch
            batch_readahead=1,
            fragment_readahead=READAHEAD,
            use_threads=True,
            # local files: reading each column chunk on its own, as the decode asks for it,
            # costs less CPU than pre-buffering them (measured: 2.0 against 2.2 us a record)
            fragment_scan_options=pds.ParquetFragmentScanOptions(pre_buffer=False),
            memory_pool=_scan_pool(),
        )
        self.scans.append(_Scan(iter(scanner.scan_batches()), items))
        self._complete_empty()

    def _fetch(self, entry: Group) -> Any:
        """What a read of `entry` reads (its shard's row groups, from the index and footer)."""
        reader = self.reader
        fmt: Any = reader.fmt  # Parquet's
        with active(reader.stats):
            return fmt.fetch(
                self.fs, reader.index.shards[entry.shard], entry.first, entry.stop, reader.columns
            )

    def _next_batch(self) -> None:
        """One batch of the first scan, added to its first group's; that group decoded when
        its rows are all there."""
        scan = self.scans[0]
        entry, got, expected = scan.groups[0]
        try:
            tagged = next(scan.batches, None)
        except Exception:  # which group failed is found by reading them one by one
            self._break()
            return
        if tagged is None:
            self._wrong(entry, got, expected, self.rows, "the scan ended")
            return
        batch = tagged.record_batch
        if not batch.num_rows:  # an empty row group's, if any: empty groups end at once
            return
        groups = [g.id for g in tagged.fragment.row_groups]
        if groups != list(got.groups) or self.rows + batch.num_rows > expected:
            self._wrong(entry, got, expected, self.rows + batch.num_rows, "a batch")
            return
        self.got.append(batch)
        self.rows += batch.num_rows
        if self.rows == expected:
            self._decoded(pa.Table.from_batches(self.got, schema=batch.schema))

    def _decoded(self, table: pa.Table) -> None:
        """The first scan's first group's rows are all read: decode it (checked, shaped),
        and move on to the next group (and scan)."""
        scan = self.scans[0]
        entry, got, _ = scan.groups.popleft()
        self.got, self.rows = [], 0
        if not scan.groups:
            self.scans.popleft()
        self._finish(entry, got, table)
        self._complete_empty()
        self._top_up()

    def _complete_empty(self) -> None:
        """Groups of no rows yield no batch: decoded at once when first in line."""
        while self.scans and self.scans[0].groups[0][2] == 0:
            got = self.scans[0].groups[0][1]
            schema = got.meta.schema.to_arrow_schema()
            cols = schema.names if got.cols is None else got.cols
            self._decoded(schema.empty_table().select(cols))

    def _wrong(self, entry: Group, got: Any, expected: int, rows: int, what: str) -> None:
        """The scan gave the first group other rows than its footer says."""
        url = redact(got.shard.url)
        error = ShardError(
            f"{url}: row groups {list(got.groups)} decode to {rows} rows ({what}), "
            f"the footer says {expected}: a damaged file"
        )
        self.scans[0].groups.popleft()
        self._break()
        finish(entry, None, error)

    def _break(self) -> None:
        """A scan failed: the groups left are read one by one (errors named exactly)."""
        self.broken = True
        self.left.extend(i for scan in self.scans for i in scan.groups)
        self.scans.clear()
        self.got, self.rows = [], 0

    def _one_by_one(self) -> None:
        """(After a scan failed) decode the next group by the format itself."""
        if self.left:
            entry, got, _ = self.left.popleft()
        elif self.queue:
            entry = self.queue.popleft()
            try:
                got = self._fetch(entry)
            except Exception as e:
                finish(entry, None, e)
                return
        else:
            raise RuntimeError("a group waited for is in no scan")  # never: `add` first
        self._finish(entry, got, None)

    def _finish(self, entry: Group, got: Any, table: pa.Table | None) -> None:
        """End `entry`'s reading: its block (decoded by the format from `table`, the scan's
        rows, or, None, read by the format itself), its error, or nothing if let go."""
        if entry.dropped:
            finish(entry, None)
            return
        block, error = None, None
        try:
            block = self.reader.decode(self.fs, entry, got, table)
        except BaseException as e:
            error = e
        finish(entry, block, error)


@functools.cache
def _scan_pool() -> pa.MemoryPool | None:
    """The memory pool scans decode into: jemalloc's where pyarrow has it (Linux, macOS),
    else pyarrow's default. Freed blocks go back to the scan's threads' heaps, which
    mimalloc (pyarrow's default) keeps growing: measured on perfcheck's set, peak RSS
    growth of a pass 148-183 MB with mimalloc, 89 with jemalloc (108 with the system's; 109
    when the consumer decoded alone), at the same CPU a record."""
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowNotImplementedError):
        return None


def _footer_rows(got: Any) -> int:
    """Rows of the row groups a read reads, by the footer."""
    rows = got.shard.details["row_group_rows"]
    return int(sum(rows[g] for g in got.groups))
