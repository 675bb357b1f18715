"""Retries of storage reads: bounded attempts, exponential backoff with full jitter.

s3fs and botocore retry some errors themselves; this layer sits above them so that what
they give up on (a 503 storm, a connection reset mid-body, a timeout) is retried too, with
a bound the user sets, and so that the final error names the shard and the last cause.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import ShardError, StaleIndexError
from .stats import current
from .storage import Indexed, cat_ranges, denied, redact

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
    """Up to `max_attempts` tries of each read; before try k+1 a random wait in
    [0, min(max_delay, base_delay * 2**k)] ("full jitter")."""

    max_attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"invalid retry policy {self}: attempts >= 1, delays >= 0")

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))


def is_transient(e: BaseException) -> bool:
    """Worth retrying: timeouts, dropped connections, 5xx and throttling answers."""
    if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError | ShardError):
        return False
    if isinstance(e, TimeoutError | ConnectionError):
        return True
    if {t.__name__ for t in type(e).__mro__} & set(_TRANSIENT_NAMES):
        return True
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = response.get("Error", {}).get("Code", "")
        return bool(status >= 500 or code in _TRANSIENT_CODES)
    if isinstance(e, OSError):
        return e.errno not in _PERMANENT_ERRNO
    return False


def retrying(what: str, policy: RetryPolicy, fn: Callable[[], T]) -> T:
    """fn() until it succeeds, a permanent error, or the policy's last attempt. `what`
    names the shard or URL for the log and the final error."""
    for attempt in range(policy.max_attempts):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                raise
            if attempt + 1 == policy.max_attempts:
                raise ShardError(
                    f"{redact(what)}: still failing after {policy.max_attempts} attempts; "
                    f"last error: {type(e).__name__}: {redact(str(e))}"
                ) from e
            wait = policy.delay(attempt)
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
    (loader.storage.cat_ranges), each range resumed from the last byte that arrived when a
    request fails or comes back short. Raises ShardError naming the URL after
    `policy.max_attempts` failed tries of a block, FileNotFoundError / PermissionError at once.
    With `indexed` (each file's size and version in the index), a file that is no longer
    that version raises StaleIndexError instead of giving its new bytes."""
    # blocks: (range index, start, end) still to fetch; parts[i] collects range i's bytes
    todo = [
        (i, b, min(b + BLOCK, e))
        for i, (s, e) in enumerate(zip(starts, ends))
        for b in range(s, e, BLOCK)
    ]
    parts: list[dict[int, bytes]] = [{} for _ in urls]
    failures: dict[tuple[int, int], int] = {}
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
        count_fetched(sum(len(d) for d in got if isinstance(d, bytes)), len(todo))
        for (i, b, e), data in zip(todo, got):
            if isinstance(data, BaseException):
                _check(urls[i], (i, b), e, data, failures, policy)
                retry.append((i, b, e))
            elif len(data) < e - b:  # short: keep what came, ask for the rest
                if data:
                    parts[i][b] = data
                else:
                    empty = EOFError(f"no bytes at offset {b}")
                    _check(urls[i], (i, b), e, empty, failures, policy)
                retry.append((i, b + len(data), e))
            else:
                parts[i][b] = data[: e - b]
        if retry:
            stats.add("retries", len(retry))
            time.sleep(policy.delay(max(failures.values(), default=1) - 1))
        todo = retry
    return [b"".join(p[k] for k in sorted(p)) for p in parts]


def _check(
    url: str,
    block: tuple[int, int],
    e: int,
    error: BaseException,
    failures: dict[tuple[int, int], int],
    policy: RetryPolicy,
) -> None:
    """Count a failed try of `block` (range index, first byte); raise when the error is
    permanent or the block is out of attempts."""
    b = block[1]
    if isinstance(error, StaleIndexError):
        raise error
    if isinstance(error, FileNotFoundError):
        raise FileNotFoundError(f"{redact(url)}: shard not found") from error
    if isinstance(error, PermissionError):
        raise denied(url, error) from error
    if not is_transient(error) and not isinstance(error, EOFError):
        raise ShardError(
            f"{redact(url)}: cannot read bytes [{b}, {e}): {type(error).__name__}: {error}"
        ) from error
    failures[block] = n = failures.get(block, 0) + 1
    if n >= policy.max_attempts:
        raise ShardError(
            f"{redact(url)}: bytes [{b}, {e}) still failing after {n} attempts; "
            f"last error: {type(error).__name__}: {redact(str(error))}"
        ) from error
    log.warning("%s: bytes [%d, %d): %s (attempt %d)", redact(url), b, e, error, n)
