"""Azure Blob Storage (az://, abfs://, abfss://) through adlfs: its filesystem with one
retry per call and bounded timeouts, and checked ranged reads of the indexed version.

adlfs reads ranges with ``download_blob(offset, length)`` and no condition, and the
version check after a read asked ``info`` (one HEAD per shard per read). Here each
ranged read is ``download_blob`` conditioned on the indexed ETag (If-Match): a rewritten
blob answers 412, which becomes StaleIndexError, with no extra request; the answer's
Content-Range is checked as on S3.

adlfs builds its azure-storage-blob client without retry or timeout options: the SDK's
defaults retry 3 times with 15-40 s of backoff and wait 300 s for a silent connection, so
a dead endpoint took 83 s to report. `AzureBlobFileSystem` sets them on the client it
made (the SDK keeps the retry policy and transport settings on the client; its blob
clients share them). Imported only when an Azure URL is opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from adlfs import AzureBlobFileSystem as _AdlfsFileSystem

from .ranged_get import check_answer
from .store_errors import status_error
from .trips import trip

__all__ = ["AZURE_CONCURRENCY", "AzureBlobFileSystem", "azure_ranges"]

log = logging.getLogger(__name__)

AZURE_CONCURRENCY = 64  # ranged reads in flight at once
AZURE_RETRIES = 1  # the SDK's own retries of a call (ours: loader.storage.retry)
AZURE_BACKOFF = 0.2  # seconds before the SDK's retry (its default: 15 s and more)
AZURE_CONNECT_TIMEOUT = 5.0  # seconds to open a connection (the SDK's: 300)
AZURE_READ_TIMEOUT = 10.0  # seconds without a byte from an open connection (the SDK's: 300)


class AzureBlobFileSystem(_AdlfsFileSystem):  # type: ignore[misc]
    """adlfs's ``AzureBlobFileSystem(**options)`` whose client retries each call once
    after 0.2 s and gives up on a connection after 5 s to connect or 10 s without a byte
    (unless ``connection_timeout`` / ``read_timeout`` are given)."""

    def do_connect(self) -> None:
        super().do_connect()
        client = self.service_client
        try:  # the SDK's own objects: set in place, as no constructor option reaches them
            retry = client._config.retry_policy
            for name in ("total_retries", "connect_retries", "read_retries", "status_retries"):
                setattr(retry, name, AZURE_RETRIES)
            retry.initial_backoff, retry.increment_base = AZURE_BACKOFF, 1
            retry.random_jitter_range = AZURE_BACKOFF
            config = client._pipeline._transport.connection_config
        except AttributeError as e:  # another SDK version: its defaults, said once
            log.warning("azure-storage-blob: cannot set its retries and timeouts (%s)", e)
            return
        config.timeout = self._timeout_kwargs.get("connection_timeout", AZURE_CONNECT_TIMEOUT)
        config.read_timeout = self._timeout_kwargs.get("read_timeout", AZURE_READ_TIMEOUT)


# one instance cache with adlfs's, so clear_instance_cache() on either drops both
AzureBlobFileSystem._cache = _AdlfsFileSystem._cache


async def azure_ranges(
    fs: Any,
    urls: Sequence[str],
    paths: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    indexed: Sequence[tuple[int | None, str | None]],
) -> list[bytes | BaseException]:
    """Ranged reads with ``If-Match: <indexed ETag>`` (412 -> StaleIndexError), each
    answer's Content-Range checked (`check_answer`)."""
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError

    gate = asyncio.Semaphore(AZURE_CONCURRENCY)

    async def one(i: int) -> bytes:
        if ends[i] <= starts[i]:
            return b""
        size, etag = indexed[i]
        container, blob, version_id = fs.split_path(paths[i])
        condition: dict[str, Any] = {}
        if etag:
            condition = {"etag": f'"{etag}"', "match_condition": MatchConditions.IfNotModified}
        # every HTTP answer of the download with the range its request asked: the SDK
        # states the range asked as the stream's Content-Range, whatever came back
        answers: list[tuple[str, int, str | None]] = []

        def seen(response: Any) -> None:
            asked = response.http_request.headers.get("x-ms-range", "")
            answer = response.http_response
            answers.append((asked, answer.status_code, answer.headers.get("Content-Range")))

        async with gate, trip(), fs.service_client.get_blob_client(container, blob) as client:
            try:
                stream = await client.download_blob(
                    offset=starts[i],
                    length=ends[i] - starts[i],
                    version_id=version_id,
                    max_concurrency=1,
                    raw_response_hook=seen,
                    **condition,
                )
                data: bytes = await stream.readall()
            except HttpResponseError as e:
                status = e.status_code or 0
                raise status_error(urls[i], status, str(e.message or e), etag) from e
            except ValueError:  # the SDK's word for an answer without a Content-Range
                _check_answers(urls[i], answers, size)
                raise
            _check_answers(urls[i], answers, size)
            return data

    return list(await asyncio.gather(*(one(i) for i in range(len(paths))), return_exceptions=True))


def _check_answers(url: str, answers: list[tuple[str, int, str | None]], size: int | None) -> None:
    """`check_answer` on each successful (range asked, status, Content-Range) of a
    download (the failed ones were the SDK's to retry, or are raised)."""
    for asked, status, content_range in answers:
        if status >= 300:
            continue
        first, _, last = asked.removeprefix("bytes=").partition("-")
        if first.isdigit() and last.isdigit():
            check_answer(url, int(first), int(last) + 1, status, content_range, size)
