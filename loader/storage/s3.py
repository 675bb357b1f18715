"""s3fs's filesystem, with its own retries made a constructor option, and the retry and
timeout settings it gets unless storage_options say otherwise (`s3_defaults`).

s3fs takes the number of tries of each S3 call from a class attribute (`retries`, 5), not
from its constructor: ``S3FileSystem(retries=1)`` would hand `retries` on to the botocore
session, which refuses it. Reads here are retried by loader.storage.retry, so s3fs should try
once (its retry wrapper also nests: a ranged read wraps a call that retries too, 5 x 5
tries). This subclass reads `retries` from storage_options; everything else is s3fs's.
Imported only when an s3:// URL is opened.
"""

from __future__ import annotations

import os
from typing import Any

import s3fs

from .ranged_get import S3_CONCURRENCY

__all__ = ["S3FileSystem", "s3_defaults"]


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


# What s3fs and botocore get unless storage_options say otherwise: the retries of one
# read belong to loader.storage.retry (one budget, one deadline), so the layers below it retry once.
S3_RETRIES = 1  # s3fs: tries of each call (its wrapper nests: more would multiply)
S3_TOTAL_ATTEMPTS = 2  # botocore: the request and one retry (a stale pooled connection)
S3_CONNECT_TIMEOUT = 5.0  # seconds to open a connection (s3fs's own default)
S3_READ_TIMEOUT = 10.0  # seconds without a byte from an open connection (s3fs's: 15)


def s3_defaults(storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """storage_options for S3 with our defaults filled in where the user set nothing:
    ``retries`` (tries of each call by s3fs; see loader.storage.s3), botocore's
    ``config_kwargs["retries"]`` attempts (left alone too when AWS_MAX_ATTEMPTS is set)
    its ``connect_timeout`` and ``read_timeout``, and its connection pool
    (``max_pool_connections``: S3_CONCURRENCY).

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
    # botocore keeps 10 connections: 64 concurrent range reads would wait for each other,
    # and indexing N shards would take N / 10 round trips instead of N / S3_CONCURRENCY
    config.setdefault("max_pool_connections", S3_CONCURRENCY)
    config.setdefault("read_timeout", S3_READ_TIMEOUT)
    options["config_kwargs"] = config
    return options
