"""s3fs's filesystem, with its own retries made a constructor option.

s3fs takes the number of tries of each S3 call from a class attribute (`retries`, 5), not
from its constructor: ``S3FileSystem(retries=1)`` would hand `retries` on to the botocore
session, which refuses it. Reads here are retried by loader.storage.retry, so s3fs should try
once (its retry wrapper also nests: a ranged read wraps a call that retries too, 5 x 5
tries). This subclass reads `retries` from storage_options; everything else is s3fs's.
Imported only when an s3:// URL is opened.
"""

from __future__ import annotations

from typing import Any

import s3fs

__all__ = ["S3FileSystem"]


class S3FileSystem(s3fs.S3FileSystem):  # type: ignore[misc]
    """``s3fs.S3FileSystem(**options)``, except that ``retries=n`` (n >= 1) sets how many
    times s3fs tries each call (s3fs's class default: 5). Picklable as s3fs's is: the
    options, `retries` included, travel with it."""

    def __init__(self, *args: Any, retries: int | None = None, **kwargs: Any) -> None:
        if retries is not None:
            if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
                raise ValueError(
                    f"storage_options['retries'] must be an int >= 1 (tries of each S3 "
                    f"call by s3fs), got {retries!r}"
                )
            self.retries = retries
        super().__init__(*args, **kwargs)


# one instance cache with s3fs's (instances are told apart by class in fsspec's token), so
# ``s3fs.S3FileSystem.clear_instance_cache()`` drops ours too, with their listing caches
S3FileSystem._cache = s3fs.S3FileSystem._cache
