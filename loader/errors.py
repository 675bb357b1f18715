"""The project's exceptions: each names the shard (URL, credentials redacted) and the fix."""

from __future__ import annotations

import re

__all__ = ["ShardError", "StaleIndexError", "StaleSidecarError", "redact"]

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(url: str) -> str:
    """The URL with any embedded credentials (``scheme://user:pass@host``) replaced, for
    messages and logs."""
    return _USERINFO.sub("***@", str(url))


class ShardError(Exception):
    """A shard could not be read or indexed. The message starts with the shard's URL.

    Takes a single message argument, so it survives the trip from a DataLoader worker to
    the main process (torch rebuilds worker exceptions as ``type(exc)(message)``).
    """


class StaleIndexError(ShardError):
    """A shard changed (size or etag/mtime) since the index was built: rebuild the index."""


class StaleSidecarError(StaleIndexError):
    """An index written beside the shards (a DALI ``.idx`` sidecar, a wids shard list, a
    manifest) no longer describes the shard it names: rebuild it, or remove it."""
