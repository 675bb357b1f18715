"""Retries of storage reads: bounded attempts and time, exponential backoff, full jitter.

This layer holds the retry budget of a read: s3fs and botocore are told to retry once at
most of their own (see loader.storage.s3.s3_defaults), and what they give up on (a 503
storm, a connection reset mid-body, a timeout) is retried here, within `max_attempts`
tries and `deadline` seconds, so that a dead endpoint gives an error naming the shard and
the last cause in bounded time.
"""

from __future__ import annotations

import errno
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ShardError
from ..stats import current
from .filesystems import Indexed, cat_ranges, is_local, redact
from .store_errors import denied, http_status, store_error
from .through import current_cache

__all__ = [
    "RetryPolicy",
    "bytes_fetched",
    "count_fetched",
    "is_transient",
    "read_ranges",
    "retrying",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# errors that say the request itself is wrong: retrying cannot help
_PERMANENT_ERRNO = {
    errno.EINVAL,
    errno.EPERM,
    errno.EACCES,
    errno.ENOENT,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.EROFS,
    errno.ENAMETOOLONG,
}
_TRANSIENT_NAMES = (
    "ClientPayloadError",
    "ServerDisconnectedError",
    "ClientConnectorError",
    "ClientOSError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ResponseStreamingError",
    "IncompleteRead",
    "FSTimeoutError",
    "ServiceRequestError",  # azure-core: the request never reached the service
    "ServiceResponseError",  # azure-core: the connection broke before an answer
)
_TRANSIENT_CODES = (
    "SlowDown",
    "Throttling",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
)


@dataclass(frozen=True)
class RetryPolicy:
    """Up to `max_attempts` tries of each read (or index operation); before try k+1 a
    random wait in [0, min(max_delay, base_delay * 2**k)] ("full jitter").

    `deadline` (seconds, None for no bound) bounds the time one read spends retrying: no
    try starts more than `deadline` seconds after the read's first failure, and the error
    then says the deadline was reached. Each try is bounded by the storage's timeouts: on
    S3, unless storage_options set their own, botocore tries a request twice (~1 s of
    backoff between) with 5 s to connect and 10 s without a byte
    (loader.storage.s3.s3_defaults), so a try against an endpoint that accepts no
    connection ends within 11 s, against one that accepts and stays mute within 21 s. With the
    defaults a dead endpoint is thus reported within 21 + 15 + 21 = 57 s (a first try, the
    deadline, a last try); one that refuses connections or answers 503 fails each try at
    once, and the attempts run out well inside the deadline.
    """

    max_attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 5.0
    deadline: float | None = 15.0

    def __post_init__(self) -> None:
        bad_deadline = self.deadline is not None and not 0 < self.deadline < math.inf
        if self.max_attempts < 1 or self.base_delay < 0 or self.max_delay < 0 or bad_deadline:
            raise ValueError(
                f"invalid retry policy {self}: max_attempts >= 1, delays >= 0, "
                "deadline a number of seconds > 0 or None"
            )

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))

    def out_of_time(self, first_failure: float, wait: float) -> bool:
        """Whether a try after waiting `wait` more seconds would start more than
        `deadline` seconds after `first_failure` (a time.monotonic())."""
        elapsed = time.monotonic() - first_failure
        return self.deadline is not None and elapsed + wait > self.deadline


def _gave_up(
    what: str, policy: RetryPolicy, attempts: int, started: float, error: BaseException
) -> str:
    """The end of a ShardError message: why retrying stopped, and the last cause."""
    if attempts >= policy.max_attempts:
        why = f"still failing after {attempts} attempts"
    else:
        why = (
            f"retry deadline of {policy.deadline:g} s reached ({attempts} attempts, "
            f"{time.monotonic() - started:.1f} s since the first failure; "
            "RetryPolicy(deadline=...) allows more)"
        )
    return f"{redact(what)}: {why}; last error: {type(error).__name__}: {redact(str(error))}"


def is_transient(e: BaseException) -> bool:
    """Worth retrying: timeouts, dropped connections, 5xx and throttling answers."""
    if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError | ShardError):
        return False
    if isinstance(e, TimeoutError | ConnectionError):
        return True
    names = {t.__name__ for t in type(e).__mro__}
    if names & set(_TRANSIENT_NAMES):
        return True
    status = http_status(e)  # gcsfs, azure-core, aiohttp: an error carrying a status
    if status is not None:
        return status in (408, 429) or status >= 500
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = response.get("Error", {}).get("Code", "")
        return bool(status >= 500 or code in _TRANSIENT_CODES)
    if isinstance(e, OSError):
        return e.errno not in _PERMANENT_ERRNO
    return False


def retrying(what: str, policy: RetryPolicy, fn: Callable[[], T]) -> T:
    """fn() until it succeeds, a permanent error, the policy's last attempt or its
    deadline. `what` names the shard or URL for the log and the final ShardError."""
    first_failure: float | None = None
    for attempt in range(policy.max_attempts):
        try:
            return fn()
        except Exception as e:
            known = store_error(what, e)
            if known is not None:
                raise known from None  # the store client's traceback names no shard
            if not is_transient(e):
                raise
            if first_failure is None:
                first_failure = time.monotonic()
            wait = policy.delay(attempt)
            if attempt + 1 == policy.max_attempts or policy.out_of_time(first_failure, wait):
                raise ShardError(_gave_up(what, policy, attempt + 1, first_failure, e)) from e
            log.warning(
                "%s: %s (attempt %d, retrying in %.2fs)", redact(what), e, attempt + 1, wait
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


BLOCK = 8 << 20  # long ranges are fetched in blocks: a retry re-fetches only what failed

_fetched = [0]  # bytes this process asked storage for (read_ranges, local Parquet reads)
_fetched_lock = threading.Lock()


def count_fetched(n: int, requests: int = 0) -> None:
    """Add n bytes to what `bytes_fetched` reports (and to the reading thread's stats, with
    the number of storage requests that fetched them)."""
    with _fetched_lock:
        _fetched[0] += n
    stats = current()
    stats.add("bytes_fetched", n)
    if requests:
        stats.add("requests", requests)


def bytes_fetched() -> int:
    """Bytes this process has read from shards so far: the ranges fetched from storage,
    retries included (the benchmark's bytes-per-rank figure)."""
    return _fetched[0]


def read_ranges(
    fs: Any,
    urls: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    policy: RetryPolicy,
    indexed: Sequence[Indexed] | None = None,
) -> list[bytes]:
    """Bytes [starts[i], ends[i]) of urls[i], concurrently where the filesystem can
    (loader.storage.filesystems.cat_ranges), each range resumed from the last byte that arrived
    when a request fails or comes back short. Raises ShardError naming the URL, the byte range
    and the last cause when a block has failed `policy.max_attempts` tries or the
    policy's deadline has passed since the read first failed; FileNotFoundError /
    PermissionError at once. With `indexed` (each file's size and version in the index),
    a file that is no longer that version raises StaleIndexError instead of giving its new
    bytes.

    Inside a dataset's reading with a node cache (loader.storage.through.reading_shard), remote
    reads of indexed files go through the cache; local files are never cached."""
    at = current_cache()
    if at is not None and indexed is not None and not is_local(fs):
        cache, shard = at

        def fetch(
            u: Sequence[str], s: Sequence[int], e: Sequence[int], ix: Sequence[Indexed]
        ) -> list[bytes]:
            return _fetch_ranges(fs, u, s, e, policy, ix)

        return cache.read(fs, urls, starts, ends, indexed, fetch, shard)
    return _fetch_ranges(fs, urls, starts, ends, policy, indexed)


def _fetch_ranges(
    fs: Any,
    urls: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    policy: RetryPolicy,
    indexed: Sequence[Indexed] | None = None,
) -> list[bytes]:
    """`read_ranges` from storage itself."""
    # blocks: (range index, start, end) still to fetch; parts[i] collects range i's bytes
    todo = [
        (i, b, min(b + BLOCK, e))
        for i, (s, e) in enumerate(zip(starts, ends))
        for b in range(s, e, BLOCK)
    ]
    parts: list[dict[int, bytes]] = [{} for _ in urls]
    failures: dict[tuple[int, int], int] = {}
    first_failure = math.inf  # time.monotonic() when a try first failed
    stats = current()
    while todo:
        with stats.timer("fetch_s"):
            got = cat_ranges(
                fs,
                [urls[i] for i, _, _ in todo],
                [b for _, b, _ in todo],
                [e for _, _, e in todo],
                None if indexed is None else [indexed[i] for i, _, _ in todo],
            )
        retry = []
        last: tuple[int, int, int, BaseException] | None = None  # this round's last failure
        count_fetched(sum(len(d) for d in got if isinstance(d, bytes)), len(todo))
        for (i, b, e), data in zip(todo, got):
            if isinstance(data, BaseException) or not data:
                error = data if isinstance(data, BaseException) else EOFError(f"no bytes at {b}")
                first_failure = min(first_failure, time.monotonic())
                _check(urls[i], (i, b), e, error, failures, policy, first_failure)
                last = (i, b, e, error)
                retry.append((i, b, e))
            elif len(data) < e - b:  # short: keep what came, ask for the rest
                parts[i][b] = data
                retry.append((i, b + len(data), e))
            elif len(data) > e - b:  # not the bytes asked for: never cut them to size
                raise ShardError(
                    f"{redact(urls[i])}: a read of bytes [{b}, {e}) returned {len(data)} "
                    "bytes, more than asked: the storage ignored the byte range (a server "
                    "without Range support?)"
                )
            else:
                parts[i][b] = data
        if retry:
            wait = policy.delay(max(failures.values(), default=1) - 1)
            if last is not None and policy.out_of_time(first_failure, wait):
                i, b, e, error = last
                where = f"{urls[i]}: bytes [{b}, {e})"
                tries = failures[(i, b)]
                raise ShardError(_gave_up(where, policy, tries, first_failure, error)) from error
            stats.add("retries", len(retry))
            time.sleep(wait)
        todo = retry
    return [b"".join(p[k] for k in sorted(p)) for p in parts]


def _check(
    url: str,
    block: tuple[int, int],
    e: int,
    error: BaseException,
    failures: dict[tuple[int, int], int],
    policy: RetryPolicy,
    first_failure: float,
) -> None:
    """Count a failed try of `block` (range index, first byte); raise when the error is
    permanent or the block is out of attempts."""
    b = block[1]
    if isinstance(error, ShardError):  # stale, a range ignored: already names the shard
        raise error
    if isinstance(error, FileNotFoundError):
        raise FileNotFoundError(f"{redact(url)}: shard not found") from error
    if isinstance(error, PermissionError):
        raise denied(url, error) from error
    known = store_error(url, error)
    if known is not None:
        raise known from None
    if not is_transient(error) and not isinstance(error, EOFError):
        raise ShardError(
            f"{redact(url)}: cannot read bytes [{b}, {e}): {type(error).__name__}: {error}"
        ) from error
    failures[block] = n = failures.get(block, 0) + 1
    if n >= policy.max_attempts:
        raise ShardError(
            _gave_up(f"{url}: bytes [{b}, {e})", policy, n, first_failure, error)
        ) from error
    log.warning("%s: bytes [%d, %d): %s (attempt %d)", redact(url), b, e, error, n)
