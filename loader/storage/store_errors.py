"""What each object store's errors mean, as the errors shardstream raises: credentials
missing or refused -> PermissionError naming the URL and where that store's credentials
go; a status that a retry may cure -> `TransientStatusError`; a missing object ->
FileNotFoundError.

The stores' clients raise their own types (botocore's NoCredentialsError, gcsfs's
HttpError and a bare OSError("Forbidden"), azure-core's HttpResponseError family). They
are told apart here by type name and status code, so this module imports none of them
(s3fs, gcsfs and adlfs are each imported only for their own URLs).
"""

from __future__ import annotations

from ..errors import ShardError, StaleIndexError, redact

__all__ = [
    "TransientStatusError",
    "credentials_hint",
    "denied",
    "http_status",
    "no_credentials",
    "status_error",
    "store_error",
]


class TransientStatusError(OSError):
    """A store answered with a status a retry may cure (408, 429, 5xx)."""


def credentials_hint(url: str) -> str:
    """Where credentials go for the store `url` is on."""
    scheme = str(url).split("://", 1)[0].lower() if "://" in str(url) else ""
    if scheme in ("gs", "gcs"):
        return (
            "pass storage_options={'token': <a service-account JSON file, 'google_default' "
            "or 'cloud'>} or set GOOGLE_APPLICATION_CREDENTIALS (a public bucket reads with "
            "{'token': 'anon'})"
        )
    if scheme in ("az", "abfs", "abfss"):
        return (
            "pass storage_options={'connection_string': ...} or {'account_name': ..., "
            "'account_key': ...} (or 'sas_token', or 'credential'), or set "
            "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and "
            "AZURE_STORAGE_ACCOUNT_KEY"
        )
    if scheme in ("http", "https"):
        return (
            "the server wants them as request headers: pass "
            "storage_options={'headers': {'Authorization': ...}}"
        )
    return (
        "storage_options key/secret, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
        "AWS_PROFILE; a public bucket reads with storage_options={'anon': True}"
    )


def denied(url: str, error: BaseException) -> PermissionError:
    """A PermissionError naming the URL and where that store's credentials go (`error`
    itself when it is one already)."""
    if isinstance(error, PermissionError) and str(error).startswith(f"{redact(url)}: access"):
        return error
    return PermissionError(
        f"{redact(url)}: access denied ({redact(str(error)).strip()}); check the credentials "
        f"({credentials_hint(url)}) and the bucket's or container's permissions"
    )


_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError"}


def no_credentials(url: str, error: BaseException) -> PermissionError | None:
    """botocore's "Unable to locate credentials" (raised deep in the request signer, with
    a long traceback naming no bucket) as a PermissionError naming the URL and where
    credentials go; None for any other error."""
    if not {t.__name__ for t in type(error).__mro__} & _NO_CREDENTIALS:
        return None
    return PermissionError(
        f"{redact(url)}: no S3 credentials found ({error}): set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or pass "
        "storage_options={'key': ..., 'secret': ...}; a public bucket reads with "
        "storage_options={'anon': True}"
    )


_TRANSIENT_STATUS = {408, 429}


def status_error(
    url: str, status: int, message: str, version: str | None = None
) -> OSError | ShardError:
    """The error for a store's answer `status` to a read of `url` (not 2xx)."""
    text = f"{redact(url)}: HTTP {status}: {redact(message).strip()[:300]}"
    if status == 404:
        return FileNotFoundError(f"{redact(url)}: shard not found")
    if status in (401, 403):
        return denied(url, PermissionError(f"HTTP {status}: {message.strip()[:300]}"))
    if status == 412:
        return StaleIndexError(
            f"{redact(url)}: the shard changed since the index was built (version "
            f"{version} no longer matches); rebuild the index"
        )
    if status in _TRANSIENT_STATUS or status >= 500:
        return TransientStatusError(text)
    return ShardError(text)


_STATUS_ERRORS = {"HttpError", "HttpResponseError", "ClientResponseError"}


def http_status(error: BaseException) -> int | None:
    """The HTTP status a store client's error carries (gcsfs's HttpError, azure-core's
    HttpResponseError, aiohttp's ClientResponseError), else None."""
    names = {t.__name__ for t in type(error).__mro__}
    if not names & _STATUS_ERRORS:
        return None
    for attribute in ("status_code", "status", "code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int):
            return value
    return None


def store_error(url: str, error: BaseException) -> BaseException | None:
    """The error shardstream raises for a store client's `error` (None: leave it as it
    is): missing or refused credentials as PermissionError naming `url`, a 404 as
    FileNotFoundError."""
    missing = no_credentials(url, error)
    if missing is not None:
        return missing
    names = {t.__name__ for t in type(error).__mro__}
    if "ClientAuthenticationError" in names or http_status(error) in (401, 403):
        return denied(url, error)
    if "ResourceNotFoundError" in names:
        return FileNotFoundError(f"{redact(url)}: not found")
    # gcsfs raises a 403 as a bare OSError("Forbidden: <path>\n<message>")
    if type(error) is OSError and str(error).startswith("Forbidden"):
        return denied(url, error)
    # google-auth found no credentials at all (a RefreshError is left to the retries, as
    # gcsfs leaves it: a token endpoint can fail for a moment)
    if "DefaultCredentialsError" in names:
        return denied(url, error)
    return None
