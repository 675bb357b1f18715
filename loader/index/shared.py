"""A dataset's index, got once per job: given, loaded, or built; by one process or by all the
ranks of a process group (loader.index.distributed).

    no process group    ShardIndex.resolve: a saved index, one beside the shards, or a build
    a process group     rank 0 reads a saved index (or one beside the shards) and broadcasts
                        it, while the others open their storage clients; without one, every
                        rank builds a share (build_distributed)

A mixture's streams (`shared_indexes`) are got together where nothing orders them: without
a process group each remote one on a thread of its own, so their requests stand in line
once, not once a stream (local ones one after the other: their footers are Python's work,
which threads only share out); under one, rank 0 looks for all their saved indexes at once
(one broadcast), then the streams without one are built by all ranks, one after the other
(collectives are one at a time).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch.distributed as dist
from fsspec.core import split_protocol

from ..storage.filesystems import connect
from ..storage.retry import RetryPolicy
from .beside import fetch_beside
from .collectives import broadcast_object
from .distributed import Failure, build_distributed
from .shard_index import INDEX_SUFFIXES, ShardIndex

__all__ = ["shared_index", "shared_indexes"]

T = TypeVar("T")
Order = Callable[[int], npt.NDArray[np.int64]]  # n shards -> the order ranks read them in

log = logging.getLogger(__name__)


def _grouped() -> bool:
    """Whether an initialized process group of more than one rank is there."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _on_rank_0(load: Callable[[], T], what: str) -> T:
    """`load()` on rank 0, broadcast to every rank; its error raised on every rank."""
    got: Any = None
    if dist.get_rank() == 0:
        try:
            got = load()  # pickles as its arrays
        except Exception as e:
            got = Failure.of(e, f"on rank 0, loading {what}")
    got = broadcast_object(got, src=0)
    if isinstance(got, Failure):
        raise got.error()
    loaded: T = got
    return loaded


def _saved(source: Any, storage_options: dict[str, Any] | None) -> ShardIndex | None:
    """On rank 0: the saved index `source` names, or the one saved beside its shards
    (loader.index.beside, one request), or None."""
    if isinstance(source, str) and source.endswith(INDEX_SUFFIXES):
        return ShardIndex.load(source, storage_options)
    try:
        found = fetch_beside(source, storage_options)
    except Exception as e:  # the build that follows names what is wrong
        log.debug("looking for an index beside %s: %s", source, e)
        return None
    return None if found is None else ShardIndex.load(found[0], storage_options, found[1])


def _loadable(source: Any) -> bool:
    return not isinstance(source, ShardIndex) and isinstance(source, str | list | tuple)


def shared_index(
    source: Any,
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy,
    order: Order | None = None,
) -> ShardIndex:
    """The dataset's index, built once per job: as given (a ShardIndex); without a process
    group (or with one rank), built or loaded here; under one, a saved index read by rank
    0 and broadcast, else built by all ranks (`build_distributed`, `order` its reading
    order of the shards)."""
    return shared_indexes([source], [storage_options], retry, [order])[0]


def shared_indexes(
    sources: Sequence[Any],
    storage_options: Sequence[dict[str, Any] | None],
    retry: RetryPolicy,
    orders: Sequence[Order | None],
) -> list[ShardIndex]:
    """`shared_index` of each source (a mixture's streams), got together (see the module's
    docstring); an error is the first stream's that failed."""
    if not _grouped():
        if sum(_remote(s) for s in sources) < 2:  # one source, or local footers: Python's
            # work (GIL-bound), which threads only slow (3 local streams, 16 footers: 18 ms
            # against 13). (A loop: an error's traceback gets no comprehension frame.)
            out = []
            for source, options in zip(sources, storage_options):
                out.append(_resolve(source, options, retry))
            return out
        with ThreadPoolExecutor(len(sources), thread_name_prefix="shardstream-index") as pool:
            got = [pool.submit(_resolve, s, o, retry) for s, o in zip(sources, storage_options)]
            return [f.result() for f in got]

    pairs = list(zip(sources, storage_options))

    def saved() -> list[ShardIndex | None]:
        todo = [k for k, s in enumerate(sources) if _loadable(s)]
        if len(todo) <= 1:
            return [_saved(s, o) if k in todo else None for k, (s, o) in enumerate(pairs)]
        with ThreadPoolExecutor(len(todo), thread_name_prefix="shardstream-index") as pool:
            got = {k: pool.submit(_saved, *pairs[k]) for k in todo}
            return [got[k].result() if k in got else None for k in range(len(sources))]

    # the other ranks open their clients while rank 0 looks (see `_opening`)
    opened = _opening(pairs) if dist.get_rank() != 0 else None
    try:
        # (no collective where nothing is loaded: a ShardIndex given needs no other rank)
        found = (
            _on_rank_0(saved, "the saved index" if len(sources) == 1 else "the saved indexes")
            if any(_loadable(s) for s in sources)
            else [None] * len(sources)
        )
    finally:
        if opened is not None:
            opened.join()
    out = []
    for source, options, order, index in zip(sources, storage_options, orders, found):
        if isinstance(source, ShardIndex):
            out.append(source)
        elif not _loadable(source):
            out.append(ShardIndex.resolve(source))  # raises the same ValueError on every rank
        elif index is not None:
            out.append(index)
        else:
            out.append(build_distributed(source, options, retry, order))
    return out


def _opening(pairs: Sequence[tuple[Any, dict[str, Any] | None]]) -> threading.Thread | None:
    """A thread opening this process's storage clients for the remote sources of `pairs`
    (loader.storage.filesystems.connect: s3fs's import and a botocore client, ~0.5 s of
    CPU on a busy machine), started now; None where no source is remote. A rank other than
    0 runs it while it waits for rank 0's saved index and joins it once that came: rank 0
    waits at the broadcast for no other rank's client (opened before the broadcast, they
    held it back), and no rank's client is built after rank 0's answer (no saved index:
    the listing's broadcast then waited 0.6-0.7 s for them; a saved index: a rank's first
    read did). Measured, 4 ranks on 2 cores, a saved index: the last rank's first batch
    1.20-1.25 s -> 0.99-1.07 (rank 0's own 0.43 -> ~0.8: the clients share its cores)."""
    remote = [(s, o) for s, o in pairs if _loadable(s) and _remote(s)]
    if not remote:
        return None

    def run() -> None:
        for source, options in remote:
            connect(source, options)

    thread = threading.Thread(target=run, name="shardstream-connect", daemon=True)
    thread.start()
    return thread


def _remote(source: Any) -> bool:
    """Whether getting the source's index waits on a network: a URL of a protocol other
    than the local disk's (a ShardIndex given waits on nothing)."""
    if isinstance(source, str | os.PathLike):
        first: Any = source
    elif isinstance(source, list | tuple) and source:
        first = source[0]
    else:  # a ShardIndex given, a datasets.Dataset (local Arrow files), ...
        return False
    return split_protocol(os.fspath(first))[0] not in (None, "file", "local")


def _resolve(source: Any, storage_options: dict[str, Any] | None, retry: RetryPolicy) -> ShardIndex:
    return ShardIndex.resolve(source, storage_options, retry=retry)
