"""Storage: URLs plus plain storage_options, opened through fsspec (local, s3fs, ...).

Nothing here holds an open filesystem across a fork: callers pass the URL and the
storage_options (both picklable) and open the filesystem in the process that reads.
fsspec's instance cache is per process, so each DataLoader worker gets its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

__all__ = [
    "FileEntry",
    "denied",
    "filesystem",
    "list_files",
    "redact",
    "strip_credentials",
    "version_of",
]

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


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


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(filesystem, path) for a URL; s3:// URLs use s3fs's options, e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}``, and otherwise the standard AWS variables
    (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""
    try:
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
