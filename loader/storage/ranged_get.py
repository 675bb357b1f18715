"""Ranged GETs over HTTP-based stores (S3, plain HTTP(S)), each answer checked: the bytes
handed on are the bytes asked for, of the indexed version, or an error says why.

fsspec's ``cat_ranges`` takes no per-range headers (S3's If-Match), and its HTTP
filesystem returns whatever body the server sends: a server that ignores ``Range``
answers 200 with the whole file, which fsspec passes on as the range's bytes. So the
requests are made here, through the filesystems' own sessions (s3fs's ``_call_s3``: its
endpoint, credentials and error translation; fsspec HTTP's aiohttp session), and every
answer is checked: its status (206 for a part of a file), its ``Content-Range`` (the
range asked, of a file of the indexed size) and its length (checked again by
`loader.storage.retry.read_ranges`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from ..errors import STALE, ShardError, StaleIndexError, redact
from .store_errors import status_error
from .trips import trip

__all__ = ["S3_CONCURRENCY", "RangeIgnoredError", "http_ranges", "is_http", "s3_ranges"]

S3_CONCURRENCY = 64  # ranged GETs in flight at once, and connections kept (botocore: 10)
HTTP_CONCURRENCY = 16  # ranged GETs in flight at once to one HTTP server

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class RangeIgnoredError(ShardError):
    """The server answered a ranged GET with something other than the range asked for
    (usually 200 and the whole file: no Range support). shardstream reads shards by
    ranges, so such a server cannot serve them: put them behind one that honours Range
    (nginx, Apache, S3, GCS, any CDN) or copy them to local disk."""


def is_http(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return bool({"http", "https"} & set(protocols))


def check_answer(
    url: str, start: int, end: int, status: int, content_range: str | None, size: int | None
) -> None:
    """RangeIgnoredError unless the answer to a GET of bytes [start, end) is that part of a
    file of `size` bytes (when known): status 206 with a matching Content-Range, or 200
    when the range is the whole file."""
    if status == 200 and start == 0 and size is not None and end >= size:
        return  # the whole file was asked for: a 200 is the answer
    found = _CONTENT_RANGE.fullmatch((content_range or "").strip())
    if status != 206 or found is None:
        raise RangeIgnoredError(
            f"{redact(url)}: asked for bytes [{start}, {end}), the server answered "
            f"{status} with Content-Range {content_range!r}: it ignores Range requests, and "
            "shardstream reads shards by ranges; serve the shards from a server that honours "
            "Range (nginx, Apache, S3, a CDN) or copy them to local disk"
        )
    first, last, total = found.groups()
    want_last = end - 1 if size is None else min(end, size) - 1
    if int(first) != start or int(last) != want_last:
        raise RangeIgnoredError(
            f"{redact(url)}: asked for bytes [{start}, {end}), the server sent bytes "
            f"[{first}, {int(last) + 1}) (Content-Range {content_range!r})"
        )
    if size is not None and total != "*" and int(total) != size:
        raise StaleIndexError(
            f"{redact(url)}: the server says the file holds {total} bytes, the index "
            f"{size}: {STALE}"
        )


async def s3_ranges(
    fs: Any,
    urls: Sequence[str],
    paths: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    indexed: Sequence[tuple[int | None, str | None]],
) -> list[bytes | BaseException]:
    """Ranged GETs with ``If-Match: <indexed ETag>`` (a 412 -> StaleIndexError, no extra
    request), through s3fs's ``_call_s3``. A store that cannot evaluate If-Match (s3fs's
    ``local_expiry_check``) gets the ETag compared on the answer instead, as s3fs itself
    does. Each answer's Content-Range is checked (`check_answer`)."""
    gate = asyncio.Semaphore(S3_CONCURRENCY)
    local_check = bool(getattr(fs, "local_expiry_check", False))

    async def one(i: int) -> bytes:
        if ends[i] <= starts[i]:
            return b""
        size, etag = indexed[i]
        bucket, key, version_id = fs.split_path(paths[i])
        kw: dict[str, Any] = {"Range": f"bytes={starts[i]}-{ends[i] - 1}"}
        if version_id:
            kw["VersionId"] = version_id
        if etag and not local_check:
            kw["IfMatch"] = f'"{etag}"'
        async with gate, trip():
            try:
                resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
            except OSError as e:
                if _precondition_failed(e):
                    raise _stale_etag(urls[i], etag) from e
                raise
            try:
                if local_check and etag and resp.get("ETag", "").strip('"') != etag:
                    raise _stale_etag(urls[i], etag)
                status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
                check_answer(urls[i], starts[i], ends[i], status, resp.get("ContentRange"), size)
                data: bytes = await resp["Body"].read()
                return data
            finally:
                resp["Body"].close()

    return list(await asyncio.gather(*(one(i) for i in range(len(paths))), return_exceptions=True))


async def http_ranges(
    fs: Any,
    urls: Sequence[str],
    starts: Sequence[int],
    ends: Sequence[int],
    sizes: Sequence[int | None],
) -> list[bytes | BaseException]:
    """Ranged GETs through fsspec HTTP's session, each answer checked (`check_answer`):
    a server ignoring Range is a RangeIgnoredError naming the URL, never garbled bytes."""
    gate = asyncio.Semaphore(HTTP_CONCURRENCY)
    session = await fs.set_session()

    async def one(i: int) -> bytes:
        if ends[i] <= starts[i]:
            return b""
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        headers["Range"] = f"bytes={starts[i]}-{ends[i] - 1}"
        headers["Accept-Encoding"] = "identity"  # the stored bytes, not a recompression
        async with gate, trip(), session.get(fs.encode_url(urls[i]), headers=headers, **kw) as r:
            if r.status >= 400:
                text = (await r.read())[:500].decode("utf-8", "replace")
                raise status_error(urls[i], r.status, text)
            check_answer(
                urls[i], starts[i], ends[i], r.status, r.headers.get("Content-Range"), sizes[i]
            )
            data: bytes = await r.read()
            return data

    return list(await asyncio.gather(*(one(i) for i in range(len(urls))), return_exceptions=True))


def _precondition_failed(e: BaseException) -> bool:
    """s3fs turns a 412 into OSError(EINVAL) caused by botocore's ClientError."""
    cause = e.__cause__ or e.__context__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return bool(code == "PreconditionFailed" or status == 412)


def _stale_etag(url: str, etag: str | None) -> StaleIndexError:
    return StaleIndexError(
        f"{redact(url)}: the shard changed since the index was built (its ETag is no "
        f"longer {etag}); rebuild the index"
    )
