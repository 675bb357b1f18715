"""The index built by many processes: one lists, each scans a disjoint share, all assemble.

Under an initialized torch.distributed process group (`build_distributed`):

    rank 0      discover(source)              the listing (or manifest), once
    broadcast   the listing                   every rank gets the same shard order
    rank r      scan(share r)                 1/R of the footers, headers or sidecars
                                              (a run of the order the ranks will read)
    all_gather  the parts                     every rank gets every part
    every rank  assemble(listing, parts)      the same index, on every rank

Every rank takes part in both collectives whatever happens: an exception while listing
or scanning travels in the collective as its type and message, and every rank then raises
the same error (the first failing rank's, which names the shard), so no rank is left
waiting. `build_parallel` does the same split over worker processes on one machine
(``shardstream-plan --index-workers N``). When a dataset builds rather than loads its
index: loader.index.shared.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from ..errors import ShardError, StaleIndexError, StaleSidecarError
from ..storage.filesystems import connect
from ..storage.retry import RetryPolicy
from .assemble import assemble_rows, from_ipc, scanned_rows, to_ipc
from .build import SCAN_BATCH, Listing, discover, scan, shares
from .collectives import all_gather_object, broadcast, broadcast_object
from .shard_index import ShardIndex

__all__ = ["Failure", "build_distributed", "build_parallel", "per_shard"]

T = TypeVar("T")

log = logging.getLogger(__name__)

# seconds of each step of this process's last build_distributed (for benchmarks)
LAST_BUILD: dict[str, float] = {}

_KNOWN = {
    c.__name__: c
    for c in (
        ShardError,
        StaleIndexError,
        StaleSidecarError,
        FileNotFoundError,
        PermissionError,
        ValueError,
        TypeError,
    )
}


@dataclass(frozen=True)
class Failure:
    """An exception as it travels between processes (any exception pickles this way)."""

    kind: str
    message: str
    where: str

    @classmethod
    def of(cls, e: BaseException, where: str) -> Failure:
        return cls(type(e).__name__, str(e), where)

    def error(self) -> Exception:
        """The same kind of exception where it is one of ours or a builtin the loader
        raises (its message names the shard), else a ShardError quoting it."""
        known = _KNOWN.get(self.kind)
        if known is None:
            return ShardError(f"indexing failed {self.where}: {self.kind}: {self.message}")
        return known(f"{self.message} (indexing {self.where})")


def _scan_part(
    listing: Listing,
    positions: Sequence[int] | npt.NDArray[np.int64],
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy,
    where: str,
    also: npt.NDArray[np.int64] | None = None,
) -> bytes | Failure:
    """The rows of the shards at `positions` (scanned here), as Arrow IPC bytes: arrays
    travel between processes, not a pickled object a shard. `also`: more positions
    scanned in the same requests but not returned (their parsed footers stay in this
    process for its reads: loader.formats.parquet.meta.FOOTERS)."""
    try:
        extra = np.setdiff1d(also, positions) if also is not None else np.zeros(0, np.int64)
        every = np.concatenate([np.asarray(positions, dtype=np.int64), extra])
        scanned = scan(listing.part(every), storage_options, retry)[: len(positions)]
        return to_ipc(scanned_rows(scanned, positions))
    except Exception as e:  # travels to every process, raised there
        return Failure.of(e, where)


def _index(
    listing: Listing, parts: Sequence[bytes], storage_options: dict[str, Any] | None
) -> ShardIndex:
    """The index from the scanned parts' rows."""
    table, schemas, partitioning = assemble_rows(
        listing, [from_ipc(p) for p in parts], storage_options
    )
    return ShardIndex(
        schemas=schemas, partitioning=partitioning, table=table, format=listing.format
    )


def build_distributed(
    source: str | Sequence[str],
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    order: Callable[[int], npt.NDArray[np.int64]] | None = None,
) -> ShardIndex:
    """Build the index of `source` with every rank of the initialized default process
    group scanning a disjoint share of the shards (contiguous runs of about equal cost:
    loader.index.build.shares). Returns the same index on every rank; an error on any rank is
    raised on every rank.

    `order(n)`: the order the ranks will read the n shards in (the first epoch's shard
    order). The shares are then runs of that order, and each rank of Parquet shards also
    reads the footers of the shards its own span likely begins and ends in (`_own_span`):
    its first reads find their footers parsed, not one more round trip in line (a share
    of the listing's order is not the shards a shuffled rank reads)."""
    retry = retry or RetryPolicy()
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    listing, listed = _broadcast_listing(rank, source, storage_options, retry)
    t1 = time.perf_counter()
    line = None if order is None else order(len(listing))
    positions = shares(listing, world, line)
    # a deferred shard (a manifest's count) is not read: no rank scans it
    scanned = ~listing.defer
    if listing.schema_shard is not None:
        scanned[listing.schema_shard] = True
    mine = positions[rank][scanned[positions[rank]]]
    also = None
    if line is not None and listing.format == "parquet":
        span = _own_span(listing.sizes, line, rank, world)
        also = span[scanned[span]]
    part = _scan_part(listing, mine, storage_options, retry, f"on rank {rank}", also)
    t2 = time.perf_counter()
    gathered = all_gather_object(part)
    failed = [g for g in gathered if isinstance(g, Failure)]
    if failed:
        raise failed[0].error()
    t3 = time.perf_counter()
    index = _index(listing, gathered, storage_options)
    LAST_BUILD.clear()
    LAST_BUILD.update(
        listing=listed,
        broadcast=t1 - t0 - listed,
        scanning=t2 - t1,
        gathering=t3 - t2,
        assembling=time.perf_counter() - t3,
        total=time.perf_counter() - t0,
    )
    log.info(
        "rank %d of %d: %d shards indexed in %.2fs (listing on rank 0 %.2fs, broadcast "
        "%.2fs, scanning %d shards %.2fs, gathering %.2fs, assembling %.2fs)",
        rank,
        world,
        len(listing),
        LAST_BUILD["total"],
        listed,
        LAST_BUILD["broadcast"],
        len(mine),
        t2 - t1,
        t3 - t2,
        LAST_BUILD["assembling"],
    )
    return index


def _own_span(
    sizes: npt.NDArray[np.int64], line: npt.NDArray[np.int64], rank: int, world: int
) -> npt.NDArray[np.int64]:
    """The shards of `line` that rank `rank` of `world` likely reads (records before the
    index is built are unknown: bytes stand for them), and one more at either end."""
    if not line.size:
        return line
    ends = np.cumsum(sizes[line], dtype=np.float64)
    lo, hi = ends[-1] * rank / world, ends[-1] * (rank + 1) / world
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(ends, hi, side="left"))
    return line[max(0, first - 1) : min(line.size, last + 2)]


def _broadcast_listing(
    rank: int,
    source: str | Sequence[str],
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy,
) -> tuple[Listing, float]:
    """(rank 0's listing, the seconds rank 0 took to list) on every rank: its size (or
    its failure) as an object, then its Arrow bytes as one tensor (a million shards are
    ~60 MB of arrays, never pickled objects; the arrays on other ranks are views of the
    received buffer)."""
    head: Any = None
    data = None
    if rank == 0:
        try:
            t0 = time.perf_counter()
            data = discover(source, storage_options, retry).to_buffer()
            head = (data.size, time.perf_counter() - t0)
        except Exception as e:
            head = Failure.of(e, "on rank 0, listing the source")
    else:
        connect(source, storage_options)  # while rank 0 lists (cached where opened before)
    head = broadcast_object(head, src=0)
    if isinstance(head, Failure):
        raise head.error()
    if rank == 0:
        with warnings.catch_warnings():  # read-only, and only read: the source of the send
            warnings.simplefilter("ignore", UserWarning)
            buffer = torch.frombuffer(data, dtype=torch.uint8)
    else:
        buffer = torch.empty(int(head[0]), dtype=torch.uint8)
    broadcast(buffer, src=0)
    return Listing.from_buffer(buffer.numpy()), float(head[1])


def build_parallel(
    source: str | Sequence[str],
    storage_options: dict[str, Any] | None = None,
    workers: int = 1,
    retry: RetryPolicy | None = None,
    progress: Callable[[int, int], None] | None = None,
    listed: Callable[[int], None] | None = None,
    sidecars: bool = True,
) -> ShardIndex:
    """Build the index of `source` here, scanning with `workers` processes (batches of
    SCAN_BATCH shards each; one process lists first). A failing batch stops the build and
    its error, which names the shard, is raised here."""
    retry = retry or RetryPolicy()
    listing = discover(source, storage_options, retry, listed, sidecars)
    n = len(listing)
    if workers <= 1 or n <= SCAN_BATCH:
        return ShardIndex.assembled(
            listing, scan(listing, storage_options, retry, progress), storage_options
        )
    batches = [list(range(lo, min(n, lo + SCAN_BATCH))) for lo in range(0, n, SCAN_BATCH)]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    parts: list[bytes] = []
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending = {
            pool.submit(_scan_part, listing, b, storage_options, retry, "in a worker"): b
            for b in batches
        }
        done = 0
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                batch = pending.pop(future)
                got = future.result()
                if isinstance(got, Failure):
                    for other in pending:
                        other.cancel()
                    raise got.error()
                parts.append(got)
                done += len(batch)
                if progress is not None:
                    progress(done, n)
    return _index(listing, parts, storage_options)


def per_shard(
    fn: Callable[[int], T], shards: Sequence[int], what: str, threads: int = 16
) -> list[T]:
    """`fn` of every shard, in `threads` threads; under an initialized process group each
    rank takes a 1/R share and the shares are all-gathered (as the index is built, so no
    rank reads every shard): every rank gets the list. An error on any rank is raised on
    every rank, naming the shard. `what` names the results in errors ("the token
    counts")."""
    group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if group else (0, 1)
    mine = list(shards)[rank::world]
    got: list[Any] | Failure
    try:
        with ThreadPoolExecutor(max(1, min(threads, len(mine)))) as pool:
            got = list(pool.map(fn, mine))
    except (ShardError, OSError, ValueError, TypeError) as e:
        if not group:
            raise
        got = Failure.of(e, f"{what} of rank {rank}'s shards")
    if not group:
        assert not isinstance(got, Failure)
        return got
    parts = all_gather_object(got)
    for part in parts:
        if isinstance(part, Failure):
            raise part.error()
    out: list[Any] = [None] * len(shards)
    for r, part in enumerate(parts):
        for i, value in enumerate(part):
            out[r + i * world] = value
    return out
