"""Google Cloud Storage (gs://) through gcsfs: its filesystem with one try per call and
bounded timeouts, and checked ranged reads of the indexed generation.

gcsfs's own ``cat_ranges`` checks neither the answer's status nor its ``Content-Range``,
and its ``info`` answers from a listing cache, so a shard rewritten after indexing was read
from its new bytes. Here each ranged GET goes through gcsfs's session and credentials
(its ``_get_headers``) with ``ifGenerationMatch=<indexed generation>``: GCS answers 412
when the object was rewritten (StaleIndexError, no extra request), and the answer's
``x-goog-generation`` header names the generation served. A server that sends no
``x-goog-generation`` (an emulator, a proxy that drops it) cannot show which version it
sent, so the object's generation is then asked once per file and read, from the JSON API
itself, never from gcsfs's listing cache (as it is for an index saved before generations
were kept, whose version is the object's ETag).

The filesystem is gcsfs's core ``GCSFileSystem``, not the "extended" one gcsfs picks when
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT is on (its default): that one asks a gRPC control API
for each bucket's layout, which on an emulator or without network waits 60 s a call. The
reads here use the JSON API, which every bucket (and emulator) serves. Imported only when
a gs:// URL is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
from gcsfs.core import GCSFileSystem as _CoreGCSFileSystem
from gcsfs.retry import retry_request

from ..errors import StaleIndexError, redact
from .ranged_get import check_answer
from .store_errors import status_error
from .trips import trip

__all__ = ["GCS_CONCURRENCY", "GCSFileSystem", "gcs_ranges"]

GCS_CONCURRENCY = 64  # ranged GETs in flight at once
GCS_CONNECT_TIMEOUT = 5.0  # seconds to open a connection
GCS_READ_TIMEOUT = 10.0  # seconds without a byte from an open connection


class GCSFileSystem(_CoreGCSFileSystem):  # type: ignore[misc]
    """gcsfs's core ``GCSFileSystem(**options)``, trying each call once (gcsfs tries 6
    times with backoff up to 32 s; our RetryPolicy retries reads, one budget and one
    deadline), and with connect and read timeouts unless ``requests_timeout`` is given
    (gcsfs's default: aiohttp's 5 minutes a request)."""

    # gcsfs binds its tries when the class is defined (``@retry_request(retries=6)``):
    # the same request method, wrapped to try once
    _request = retry_request(retries=1)(_CoreGCSFileSystem._request.__wrapped__)

    def __init__(self, *args: Any, requests_timeout: Any = None, **kwargs: Any) -> None:
        if requests_timeout is None:
            requests_timeout = aiohttp.ClientTimeout(
                sock_connect=GCS_CONNECT_TIMEOUT, sock_read=GCS_READ_TIMEOUT
            )
        super().__init__(*args, requests_timeout=requests_timeout, **kwargs)


# one instance cache with gcsfs's, so clear_instance_cache() on either drops both
GCSFileSystem._cache = _CoreGCSFileSystem._cache


async def gcs_ranges(
    fs: Any,
    urls: Sequence[str],
    paths: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    indexed: Sequence[tuple[int | None, str | None]],
) -> list[bytes | BaseException]:
    """Ranged GETs of the indexed generation (see the module's docstring), each answer
    checked (`check_answer`): status 206 and the Content-Range asked for, of a file of the
    indexed size."""
    gate = asyncio.Semaphore(GCS_CONCURRENCY)
    await fs._set_session()
    unproven: set[int] = set()  # reads whose answer named no generation

    async def one(i: int) -> bytes:
        if ends[i] <= starts[i]:
            return b""
        size, generation = indexed[i]
        want = generation if generation and generation.isdigit() else None
        url, _, _ = fs.url(paths[i]).partition("?")  # gcsfs's quoting of the object name
        params = fs._get_params({"alt": "media", "ifGenerationMatch": want})
        headers = fs._get_headers({"Range": f"bytes={starts[i]}-{ends[i] - 1}"})
        async with (
            gate,
            trip(),
            fs.session.get(url, params=params, headers=headers, timeout=fs.requests_timeout) as r,
        ):
            if r.status >= 300:
                text = (await r.read())[:500].decode("utf-8", "replace")
                raise status_error(urls[i], r.status, text, generation)
            served = r.headers.get("x-goog-generation")
            if want is not None and served is not None and served != want:
                raise _stale(urls[i], want, served)
            if generation and (served is None or want is None):
                # the answer proves no generation, or the index holds an ETag (saved
                # before generations were kept): asked after the reads
                unproven.add(i)
            check_answer(
                urls[i], starts[i], ends[i], r.status, r.headers.get("Content-Range"), size
            )
            data: bytes = await r.read()
            return data

    got: list[bytes | BaseException] = list(
        await asyncio.gather(*(one(i) for i in range(len(paths))), return_exceptions=True)
    )
    if unproven:
        await _check_generations(fs, urls, paths, indexed, sorted(unproven), got)
    return got


async def _check_generations(
    fs: Any,
    urls: Sequence[str],
    paths: Sequence[str],
    indexed: Sequence[tuple[int | None, str | None]],
    reads: list[int],
    got: list[bytes | BaseException],
) -> None:
    """The object's generation asked once per file (after its reads: a rewrite before or
    during them is seen), from the JSON API, not gcsfs's listing cache; a file that is
    no longer the indexed generation turns its reads into StaleIndexError."""
    files: dict[str, list[int]] = {}
    for i in reads:
        files.setdefault(paths[i], []).append(i)

    async def now(path: str) -> tuple[str, str] | None:
        bucket, key, _ = fs.split_path(path)
        try:
            async with trip():
                meta = await fs._call("GET", "b/{}/o/{}", bucket, key, json_out=True)
        except FileNotFoundError:
            return None
        return str(meta.get("generation")), str(meta.get("etag"))

    found = await asyncio.gather(*(now(p) for p in files), return_exceptions=True)
    for reads_of, current in zip(files.values(), found):
        want = indexed[reads_of[0]][1]
        for i in reads_of:
            if isinstance(current, BaseException):
                got[i] = current
            elif current is None or want not in current:  # an older index holds the ETag
                got[i] = _stale(urls[i], want, None if current is None else current[0])


def _stale(url: str, want: str | None, now: str | None) -> StaleIndexError:
    found = "the object is gone" if now is None else f"its generation is now {now}"
    return StaleIndexError(
        f"{redact(url)}: the shard changed since the index was built (indexed generation "
        f"{want}; {found}); rebuild the index"
    )
