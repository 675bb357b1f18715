"""Shard URLs as strings: which are relative to a folder, joined to it, normalized.

One rule everywhere a folder names shards by relative names (a manifest, a saved index's
local paths, a wids shard list): a name with no scheme and no leading ``/`` is relative.
"""

from __future__ import annotations

import posixpath

__all__ = ["full_url", "is_relative", "normalize_url"]


def is_relative(url: str) -> bool:
    """True where `url` has no scheme and no leading ``/``."""
    return "://" not in url and not url.startswith("/")


def full_url(base: str, url: str) -> str:
    """`url` joined to `base` where it is relative (and a base is given)."""
    return f"{base}/{url}" if base and is_relative(url) else url


def normalize_url(url: str) -> str:
    """A URL with ``.`` and ``..`` segments resolved, for matching shards to a list."""
    scheme, sep, path = url.rpartition("://")
    return scheme + sep + posixpath.normpath(path) if path else url
