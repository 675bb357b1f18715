"""One object store for a test, whichever it is (S3 on moto, GCS on gcp-storage-emulator,
Azure on Azurite, a plain HTTP server on a folder): a fresh bucket, a filesystem that
writes into it, and the URLs and storage_options a dataset reads it with, directly or
through a proxy (scripts/s3proxy.py) in front of the same server."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.emulators import AZURITE_KEY, azurite_connection_string

_names = itertools.count()


@dataclass
class Store:
    kind: str  # "s3", "gcs", "azure" or "http"
    endpoint: str  # the server's URL
    bucket: str  # this test's bucket or container ("" for http)
    folder: Path | None = None  # http: the folder the server serves

    @property
    def scheme(self) -> str:
        return {"s3": "s3", "gcs": "gs", "azure": "az", "http": ""}[self.kind]

    def url(self, rel: str, endpoint: str | None = None) -> str:
        """The URL of `rel` in this test's bucket (for http, on `endpoint`: the server or
        a proxy in front of it)."""
        if self.kind == "http":
            return f"{endpoint or self.endpoint}/{rel}"
        return f"{self.scheme}://{self.bucket}/{rel}"

    def options(self, endpoint: str | None = None, credentials: bool = True) -> dict[str, Any]:
        """storage_options reaching the store at `endpoint` (default: the server itself);
        `credentials` False: none (anonymous)."""
        at = endpoint or self.endpoint
        if self.kind == "s3":
            options: dict[str, Any] = {"client_kwargs": {"endpoint_url": at}}
            if not credentials:
                options["anon"] = True
            return options
        if self.kind == "gcs":
            # the emulator checks no credentials: "anon" sends none (see `test_store_contract`)
            return {"endpoint_url": at, "token": "anon", "project": "test"}
        if self.kind == "azure":
            key = AZURITE_KEY if credentials else None
            return {"connection_string": azurite_connection_string(at, key)}
        return {}

    def fs(self) -> Any:
        """A plain filesystem (the clients' own, not shardstream's) writing into the store;
        paths are `path(rel)`."""
        if self.kind == "s3":
            import s3fs

            return s3fs.S3FileSystem(
                client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True
            )
        if self.kind == "gcs":
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(
                endpoint_url=self.endpoint, token="anon", project="test", skip_instance_cache=True
            )
        if self.kind == "azure":
            from adlfs import AzureBlobFileSystem

            return AzureBlobFileSystem(
                connection_string=azurite_connection_string(self.endpoint),
                skip_instance_cache=True,
            )
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem()

    def path(self, rel: str) -> str:
        if self.kind == "http":
            assert self.folder is not None
            return str(self.folder / rel)
        return f"{self.bucket}/{rel}"

    def open_to_anyone(self) -> None:
        """Make the bucket publicly readable where requests are otherwise signed (Azure:
        its SharedKey signs the x-ms-range header, so a proxy changing the range would
        only get a 403): `options(credentials=False)` read it."""
        if self.kind == "azure":
            import asyncio

            from azure.storage.blob.aio import BlobServiceClient

            async def public() -> None:
                conn = azurite_connection_string(self.endpoint)
                async with BlobServiceClient.from_connection_string(conn) as client:
                    container = client.get_container_client(self.bucket)
                    await container.set_container_access_policy({}, public_access="container")

            asyncio.run(public())

    def rewrite(self, rel: str, data: bytes) -> None:
        """Replace `rel` with `data` (a new version: for http, a later Last-Modified)."""
        self.fs().pipe(self.path(rel), data)
        if self.kind == "http":
            later = os.stat(self.path(rel)).st_mtime + 5
            os.utime(self.path(rel), (later, later))


def new_bucket(kind: str, endpoint: str, folder: Path | None = None) -> Store:
    """A Store with a fresh, empty bucket on the server at `endpoint`."""
    name = "" if kind == "http" else f"t{os.getpid()}-{next(_names)}"
    store = Store(kind, endpoint, name, folder)
    if kind != "http":
        store.fs().mkdir(name)
    return store
