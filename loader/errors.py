"""The project's exceptions: each names the shard (URL, credentials redacted) and the fix."""

from __future__ import annotations

import re

__all__ = ["STALE", "ShardError", "StaleIndexError", "StaleSidecarError", "redact"]

STALE = "the shard changed since the index was built; rebuild it"  # a StaleIndexError's ending

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
# secrets inside query strings and connection strings: an Azure SAS signature, an account key
_SECRETS = re.compile(r"(?i)\b(sig|accountkey|sharedaccesssignature)=[^&;\s'\"]+")


def redact(url: str) -> str:
    """The URL (or message) with embedded credentials replaced, for messages and logs:
    ``scheme://user:pass@host``, an Azure SAS ``sig=``, a connection string's
    ``AccountKey=``."""
    return _SECRETS.sub(r"\1=***", _USERINFO.sub("***@", str(url)))


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
