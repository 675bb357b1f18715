"""Building a ShardIndex in three steps, so that any process can do any part of it:

    discover(source)          -> Listing   the shards in index order, their format, and a
                                           hint each (a record count, a sidecar)
    scan(listing[part])       -> scanned   per shard {"num_records", "details"[, "schema"]}
    assemble(listing, scanned) -> shards, schemas, partitioning

One process runs all three (ShardIndex.build); under torch.distributed, rank 0 discovers,
every rank scans its part and all assemble the same index (loader.index.distributed).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from braceexpand import braceexpand
from fsspec.core import split_protocol

from ..columns.arrow_numpy import strings
from ..errors import StaleSidecarError
from ..formats import format_for, format_of_url, formats_of_urls, known_suffixes
from ..formats.partitions import is_hidden
from ..formats.tar.idx import find_idx, index_from_sidecars
from ..formats.tar.wids import check_wids, read_wids
from ..storage.filesystems import FileEntry, filesystem, redact, strip_credentials
from ..storage.listing import file_entry, list_files
from ..storage.retry import RetryPolicy, retrying
from ..storage.urls import normalize_url
from .assemble import assemble
from .listing import Hint, Listing
from .manifest import is_manifest, read_manifest
from .urls import full_url

__all__ = ["SCAN_BATCH", "Hint", "Listing", "assemble", "discover", "scan", "shares"]

log = logging.getLogger(__name__)

SCAN_BATCH = 256  # shards whose footers or headers are read in one concurrent batch
# files a dataset folder may hold beside its shards without a warning: saved indexes,
# wids shard lists, tar index sidecars (and manifests)
_COMPANIONS = (".json", ".idx")
_EXAMPLES = 5

Progress = Callable[[int, int], None]  # (shards done, shards in all)
_BRACES = re.compile(r"\{[^{}]*(\.\.|,)[^{}]*\}")  # {000..099} or {a,b}


def expand_braces(source: str | Sequence[str]) -> str | Sequence[str]:
    """webdataset's shard naming: ``shard-{000000..000099}.tar`` (and ``{a,b}``) as the
    list of URLs it names, by the `braceexpand` package webdataset uses; each item of a
    list likewise. Anything without such braces as it is."""
    if isinstance(source, str):
        return list(braceexpand(source)) if _BRACES.search(source) else source
    if not any(_BRACES.search(u) for u in source if isinstance(u, str)):
        return source
    return [x for u in source for x in (braceexpand(u) if isinstance(u, str) else [u])]


REQUEST_BYTES = 1 << 20  # a request costs about what reading this many bytes costs


def shares(
    listing: Listing, parts: int, order: npt.NDArray[np.int64] | None = None
) -> list[npt.NDArray[np.int64]]:
    """The listing cut into `parts` contiguous runs of shards of about equal scanning cost:
    a request per shard, plus the bytes a scan reads (a tar's whole size, a sidecar's
    size; nothing for a deferred shard) at REQUEST_BYTES per request. Shard i goes to the
    part its cost's midpoint falls in. The same on every process for the same listing.
    `order` (a permutation of the listing's positions): runs of that order instead of the
    listing's (each part's positions still ascending)."""
    n = len(listing)
    # (n,) what scanning each shard costs, in requests
    cost = np.ones(n)
    if listing.format == "tar":
        cost += listing.sizes / REQUEST_BYTES
    for i, side in listing.sidecars.items():
        cost[i] = 1.0 + side.size / REQUEST_BYTES
    cost[listing.defer] = 0.0
    if listing.schema_shard is not None:
        cost[listing.schema_shard] = 1.0  # its footer is read
    total = cost.sum()
    if total <= 0:
        cost, total = np.ones(n), float(n)
    line = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    # (n,) the part of each shard of the line: where the midpoint of its cost falls
    middle = np.cumsum(cost[line]) - cost[line] / 2
    part = np.minimum((middle * parts / max(total, 1e-12)).astype(np.int64), parts - 1)
    return [np.sort(line[part == k]) for k in range(parts)]


def _list_dir(
    source: str, storage_options: dict[str, Any] | None, listed: Callable[[int], None] | None
) -> tuple[list[FileEntry], list[FileEntry]]:
    """(shards, companion files) of a directory, prefix, glob or file, in a fixed order.

    Below a listed directory, files and folders whose names start with ``_`` or ``.`` are
    not data (Spark's ``_SUCCESS`` and ``_temporary/``, ``.crc`` files), as in
    pyarrow.dataset. Any other file without a shard suffix is skipped with a WARNING that
    names how many and a few of them, except index files (``.json``, ``.idx``)."""
    found = list_files(source, storage_options, listed)
    listed_files = [e for e in found if not is_hidden(e.relpath)]
    entries: list[FileEntry] = []  # the shards
    companions: list[FileEntry] = []  # index files: saved indexes, sidecars, wids lists
    skipped: list[str] = []  # neither
    for e in listed_files:  # each file looked at once
        companion = e.url.lower().endswith(_COMPANIONS)
        if companion:
            companions.append(e)
        if is_manifest(e.url):  # a manifest beside the shards is not one of them
            continue
        if format_of_url(e.url):
            entries.append(e)
        elif not companion:
            skipped.append(e.relpath or e.url)
    if not entries:
        names = [e.relpath or e.url for e in found]
        raise FileNotFoundError(
            f"{redact(source)}: no shards found ({len(found)} files, none ending in "
            f"{known_suffixes()} outside folders and files starting with _ or .)"
            + (f", e.g. {', '.join(names[:_EXAMPLES])}" if names else "")
            + _hint(names)
        )
    if skipped:
        log.warning(
            "%s: skipped %d file(s) that are not shards (shard suffixes: %s), e.g. %s",
            redact(source),
            len(skipped),
            known_suffixes(),
            ", ".join(skipped[:_EXAMPLES]),
        )
    if len(found) > len(listed_files):
        log.info(
            "%s: %d file(s) under names starting with _ or . are not data",
            redact(source),
            len(found) - len(listed_files),
        )
    return entries, companions


def _hint(names: Sequence[str]) -> str:
    """What to do with files of a kind users often have."""
    if any(n.lower().endswith((".npy", ".npz", ".csv", ".jsonl", ".zip")) for n in names):
        return "; convert them to Parquet (pyarrow, pandas, polars, HF datasets' to_parquet)"
    return ""


def _check_known(urls: Sequence[str] | pa.Array, base: str = "") -> None:
    urls = urls if isinstance(urls, pa.Array) else strings(list(urls))
    masks = list(formats_of_urls(urls).values())
    known = masks[0]
    for m in masks[1:]:
        known = pc.or_(known, m)
    if not pc.all(known).as_py():
        url = full_url(base, urls.filter(pc.invert(known))[0].as_py())
        raise ValueError(
            f"{redact(url)}: unknown shard format; known suffixes: {known_suffixes()}"
            + _hint([url])
        )


def _list_urls(urls: Sequence[str], storage_options: dict[str, Any] | None) -> list[FileEntry]:
    """URLs of a list as they are, each asked for its size and version."""
    if not urls:
        raise ValueError(
            "the source list is empty: give shard URLs, or loader.Stream objects for a mixture"
        )
    _check_known(urls)
    _check_distinct(urls)
    if len(urls) == 1 or split_protocol(urls[0])[0] in (None, "file", "local"):
        return [file_entry(u, storage_options) for u in urls]
    # remote: one request a URL, so ask them concurrently (16 in flight), in list order
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        return list(pool.map(lambda u: file_entry(u, storage_options), urls))


def _check_distinct(urls: Sequence[str]) -> None:
    """ValueError naming a file the list names twice: each record is read once an epoch,
    so a repeated shard would be read twice without a word (weights are a mixture's)."""
    seen: dict[str, str] = {}
    for url in urls:
        protocol, path = split_protocol(strip_credentials(url))
        key = (
            os.path.abspath(path) if protocol in (None, "file", "local") else f"{protocol}://{path}"
        )
        if key in seen:
            raise ValueError(
                f"{redact(url)}: named twice in the source list (also as {redact(seen[key])}); "
                "each shard is read once an epoch: list it once, or give it a weight in a "
                "mixture (loader.Stream(..., weight=...))"
            )
        seen[key] = url


def _one_format(urls: pa.Array, base: str = "") -> str:
    """The one format of the shards (their URLs known ones: `_check_known`)."""
    found = {name: m for name, m in formats_of_urls(urls).items() if pc.any(m).as_py()}
    if len(found) > 1:
        examples = {
            name: full_url(base, urls.filter(m)[0].as_py()) for name, m in sorted(found.items())
        }
        raise ValueError(
            "mixed shard formats in one dataset: "
            + ", ".join(f"{f} ({redact(u)})" for f, u in examples.items())
            + "; index each format separately"
        )
    return next(iter(found))


def discover(
    source: str | Sequence[str],
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    listed: Callable[[int], None] | None = None,
    sidecars: bool = True,
) -> Listing:
    """The shards of a directory, prefix, glob, file, list of URLs or manifest, in index
    order, with their format (one per dataset: mixing raises ValueError) and hints.

    Tar shards get their hints from what the listing holds beside them (with `sidecars`):
    a DALI ``.idx`` sidecar, or a wids shard list at the top of the listing (its counts
    are checked against the shards' sizes; a mismatch raises StaleSidecarError). A list
    of URLs or a manifest is taken as it is (sidecars are found by listing). `listed(n)`
    is told the files listed so far."""
    retry = retry or RetryPolicy()
    source = expand_braces(source)
    where = source if isinstance(source, str) else "the listed shards"
    companions: list[FileEntry] = []
    if is_manifest(source):
        rows = retrying(where, retry, lambda: read_manifest(str(source), storage_options, retry))
        _check_known(rows.urls, rows.base)
        listing = Listing.of_columns(
            _one_format(rows.urls, rows.base),
            rows.urls,
            rows.sizes,
            rows.versions,
            rows.records,
            str(source),
            base=rows.base,
        )
    else:
        if isinstance(source, str):
            entries, companions = retrying(
                where, retry, lambda: _list_dir(source, storage_options, listed)
            )
        else:
            entries = retrying(where, retry, lambda: _list_urls(list(source), storage_options))
        name = _one_format(strings([e.url for e in entries]))
        listing = Listing(name, entries)
        if name == "tar" and sidecars and companions:
            listing.set_hints(_tar_hints(entries, companions, storage_options, retry))
    if listing.format in ("parquet", "arrow") and len(listing) and listing.defer.all():
        listing.schema_shard = 0  # its footer gives the dataset's schema
    return listing


def _tar_hints(
    entries: Sequence[FileEntry],
    companions: Sequence[FileEntry],
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy,
) -> list[Hint | None]:
    """Per tar shard: its DALI sidecar, else its wids count (deferred), else None."""
    fs, _ = filesystem(entries[0].url, storage_options)
    idx = find_idx(entries, companions)
    counts = {} if all(idx) else read_wids(fs, companions, retry)
    hints: list[Hint | None] = []
    for entry, side in zip(entries, idx):
        count = counts.get(normalize_url(entry.url))
        if count is not None:
            check_wids(entry, count)
        if side is not None:  # a wids count, if any, is checked against the sidecar's
            records, origin = (count[0], count[2]) if count else (None, "")
            hints.append(Hint(records, origin, sidecar=side))
        elif count is not None:
            hints.append(Hint(count[0], count[2], defer=True))
        else:
            hints.append(None)
    used = sum(h is not None for h in hints)
    if used:
        log.info("%d of %d tar shards have a sidecar index or a wids count", used, len(entries))
    return hints


def scan(
    listing: Listing,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any] | None]:
    """Per shard of the listing, what its format's `scan` gives ({"num_records",
    "details"}, and "schema" for Parquet), reading as little as its hint allows:

    - a shard the hint lets be deferred: nothing read (None); its reader indexes it on
      first use (its details say ``{"deferred": <manifest or list>}``);
    - a tar shard with a DALI sidecar: the sidecar and three small checks of the shard;
    - others: the format's scan, SCAN_BATCH shards at a time.

    A shard whose scan finds another record count than its hint gives raises
    StaleSidecarError naming the manifest or list. `progress(done, total)` follows."""
    retry = retry or RetryPolicy()
    n = len(listing)
    out: list[dict[str, Any] | None] = [None] * n
    if not n:
        return []
    fs, _ = filesystem(listing.url(0), storage_options)
    fmt = format_for(listing.format, retry=retry)
    done = int(listing.defer.sum())
    # (shard, its sidecar), then the shards scanned by their format
    sided = sorted((i, e) for i, e in listing.sidecars.items() if not listing.defer[i])
    todo = ~listing.defer
    todo[[i for i, _ in sided]] = False
    rest: list[int] = np.flatnonzero(todo).tolist()
    for lo in range(0, len(sided), SCAN_BATCH):
        pairs = sided[lo : lo + SCAN_BATCH]
        unnamed = _from_sidecars(fs, listing, pairs, retry, out)
        rest += unnamed
        done += len(pairs) - len(unnamed)
        if progress is not None:
            progress(done, n)
    rest.sort()
    for lo in range(0, len(rest), SCAN_BATCH):
        batch = rest[lo : lo + SCAN_BATCH]
        for i, got in zip(batch, fmt.scan(fs, [listing.entry(i) for i in batch])):
            out[i] = got
        done += len(batch)
        if progress is not None:
            progress(done, n)
    for i in np.flatnonzero((listing.records >= 0) & ~listing.defer).tolist():
        _check_count(listing.entry(i), listing.hint(i), out[i])
    if listing.schema_shard is not None:
        out[listing.schema_shard] = _schema_only(fmt, fs, listing, listing.schema_shard)
    return out


def _schema_only(fmt: Any, fs: Any, listing: Listing, i: int) -> dict[str, Any]:
    """Shard i of a listing whose every shard is deferred, with the dataset's schema from
    its footer; it stays deferred (its reader reads the footer anyway), so the index
    holds no layout columns for a million deferred shards."""
    (got,) = fmt.scan(fs, [listing.entry(i)])
    _check_count(listing.entry(i), Hint(int(listing.records[i]), listing.origin(i)), got)
    return {
        "num_records": got["num_records"],
        "details": {"deferred": listing.origin(i)},
        "schema": got["schema"],
    }


def _from_sidecars(
    fs: Any,
    listing: Listing,
    batch: Sequence[tuple[int, FileEntry]],
    retry: RetryPolicy,
    out: list[dict[str, Any] | None],
) -> list[int]:
    """Index the (shard, sidecar) pairs of `batch` into `out`; returns the shards whose
    sidecar has no member names (v1.1), to be scanned."""
    entries = [listing.entry(i) for i, _ in batch]
    got = index_from_sidecars(fs, entries, [side for _, side in batch], retry)
    for (i, _), g in zip(batch, got):
        out[i] = g
    return [i for (i, _), g in zip(batch, got) if g is None]


def _check_count(entry: FileEntry, hint: Hint | None, got: dict[str, Any] | None) -> None:
    if hint is None or hint.records is None or got is None or hint.defer:
        return
    if int(got["num_records"]) != hint.records:
        raise StaleSidecarError(
            f"{redact(hint.origin)}: gives {hint.records} records for {redact(entry.url)}, the "
            f"shard holds {got['num_records']}; it is stale: rebuild it or remove it"
        )
