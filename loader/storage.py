"""Storage: URLs plus plain storage_options, opened through fsspec (local, s3fs, ...).

Nothing here holds an open filesystem across a fork: callers pass the URL and the
storage_options (both picklable) and open the filesystem in the process that reads.
fsspec's instance cache is per process, so each DataLoader worker gets its own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, overload

import fsspec
from fsspec.core import split_protocol, url_to_fs

__all__ = [
    "FileEntry",
    "UrlOrPath",
    "as_url",
    "denied",
    "filesystem",
    "list_files",
    "redact",
    "s3_defaults",
    "strip_credentials",
    "version_of",
]

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")

UrlOrPath = str | os.PathLike[str]  # a URL, a local path, or a pathlib.Path


@overload
def as_url(source: UrlOrPath) -> str: ...
@overload
def as_url(source: object) -> Any: ...
def as_url(source: object) -> Any:
    """`source` with paths made strings: an os.PathLike (a pathlib.Path) by os.fspath, a
    list or tuple of URLs and paths as a list of strings; anything else as it is (so the
    caller's own check names it)."""
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if isinstance(source, list | tuple) and any(isinstance(u, os.PathLike) for u in source):
        return [os.fspath(u) if isinstance(u, os.PathLike) else u for u in source]
    return source


def redact(url: str) -> str:
    """The URL with any embedded credentials (``scheme://user:pass@host``) replaced, for
    messages and logs."""
    return _USERINFO.sub("***@", str(url))


def strip_credentials(url: str) -> str:
    """The URL without embedded credentials, for what is saved (credentials belong in
    storage_options or the environment)."""
    return _USERINFO.sub("", str(url))


def denied(url: str, error: BaseException) -> PermissionError:
    """A PermissionError naming the URL and what to check."""
    return PermissionError(
        f"{redact(url)}: access denied ({redact(str(error))}); check the credentials "
        "(storage_options key/secret, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
        "AWS_PROFILE) and the bucket policy"
    )


# What s3fs and botocore get unless storage_options say otherwise: the retries of one
# read belong to loader.retry (one budget, one deadline), so the layers below it retry once.
S3_RETRIES = 1  # s3fs: tries of each call (its wrapper nests: more would multiply)
S3_TOTAL_ATTEMPTS = 2  # botocore: the request and one retry (a stale pooled connection)
S3_CONNECT_TIMEOUT = 5.0  # seconds to open a connection (s3fs's own default)
S3_READ_TIMEOUT = 10.0  # seconds without a byte from an open connection (s3fs's: 15)


def s3_defaults(storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """storage_options for S3 with our defaults filled in where the user set nothing:
    ``retries`` (tries of each call by s3fs; see loader.s3), botocore's
    ``config_kwargs["retries"]`` attempts (left alone too when AWS_MAX_ATTEMPTS is set)
    and its ``connect_timeout`` and ``read_timeout``.

    Without this, s3fs's 5 tries (nested: a ranged read wraps a call that also retries)
    times botocore's own attempts times ours made a dead endpoint take minutes to report.
    """
    options = dict(storage_options or {})
    options.setdefault("retries", S3_RETRIES)
    config = dict(options.get("config_kwargs") or {})
    retries = dict(config.get("retries") or {})
    if not {"total_max_attempts", "max_attempts"} & set(retries) and not os.environ.get(
        "AWS_MAX_ATTEMPTS"
    ):
        retries["total_max_attempts"] = S3_TOTAL_ATTEMPTS
    if retries:
        config["retries"] = retries
    config.setdefault("connect_timeout", S3_CONNECT_TIMEOUT)
    config.setdefault("read_timeout", S3_READ_TIMEOUT)
    options["config_kwargs"] = config
    return options


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(filesystem, path) for a URL; s3:// URLs use s3fs's options, e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}``, and otherwise the standard AWS variables
    (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). For s3:// the retry and timeout settings
    the options leave out are filled in by `s3_defaults`, and `retries` (tries of each
    call by s3fs) is an option too (loader.s3)."""
    try:
        if split_protocol(str(url))[0] in ("s3", "s3a"):
            from .s3 import S3FileSystem  # s3fs is imported for S3 URLs only

            options = {**S3FileSystem._get_kwargs_from_urls(url), **s3_defaults(storage_options)}
            s3 = S3FileSystem(**options)
            return s3, str(s3._strip_protocol(url))
        fs, path = url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise ValueError(f"cannot open {redact(url)}: {e}") from e
    return fs, str(path)


@dataclass(frozen=True)
class FileEntry:
    """A file found by listing: full URL, size in bytes, version (etag or mtime)."""

    url: str
    size: int
    version: str | None


def version_of(info: dict[str, Any]) -> str | None:
    """What changes when the file's content changes: S3's ETag, else the mtime."""
    for key in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return None


def entry_of(fs: Any, info: dict[str, Any]) -> FileEntry:
    """The FileEntry of an fsspec info dict."""
    return FileEntry(fs.unstrip_protocol(info["name"]), int(info["size"]), version_of(info))


def list_files(url: str, storage_options: dict[str, Any] | None = None) -> list[FileEntry]:
    """Files under a directory or prefix (recursively), matching a glob, or the file itself,
    sorted by URL. Raises FileNotFoundError naming the URL when nothing is there."""
    fs, path = filesystem(url, storage_options)
    try:
        if fsspec.core.has_magic(path):
            infos = fs.glob(path, detail=True).values()
        elif fs.isdir(path):
            infos = fs.find(path, detail=True).values()
        else:
            infos = [fs.info(path)]
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(url)}: no such file, directory or prefix") from None
    except PermissionError as e:
        raise denied(url, e) from None
    entries = [entry_of(fs, i) for i in infos if i.get("type", "file") == "file"]
    return sorted(entries, key=lambda e: e.url)


def file_entry(url: str, storage_options: dict[str, Any] | None = None) -> FileEntry:
    """Size and version of one file; FileNotFoundError naming it when missing."""
    fs, path = filesystem(url, storage_options)
    try:
        return entry_of(fs, fs.info(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"{redact(url)}: shard not found") from None
    except PermissionError as e:
        raise denied(url, e) from None
