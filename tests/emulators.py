"""The GCS and Azure emulators the tests and scripts.bench talk HTTP to, each started on a free
loopback port: `gcp-storage-emulator` (a Python package of the test extra) and Azurite's
blob service (an npm package, installed by ``scripts/setup.sh test`` into .cache/azurite)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Azurite's well-known development account (published in Azure's docs; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def azurite_connection_string(endpoint: str, key: str | None = AZURITE_KEY) -> str:
    """A connection string for Azurite's account at `endpoint` (a proxy's URL works too);
    `key` None: no credentials."""
    secret = f"AccountKey={key};" if key is not None else ""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};{secret}"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def _wait(proc: subprocess.Popen[bytes], url: str, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers: up
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start on {url}") from None
            time.sleep(0.1)


@contextmanager
def running(
    cmd: list[str], url: str, what: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A server process started by `cmd` (with `env` added to the environment), once `url`
    answers (any HTTP status); yields `url`, stops the process afterwards."""
    environ = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ)
    try:
        _wait(proc, url, what)
        yield url.rstrip("/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# gcp-storage-emulator serves from one thread with socketserver's listen backlog of 5:
# more connections at once than that (a read of 16 shards makes 16) have their SYNs
# dropped and retried a second later, a stall no store has. Started with a backlog as a
# real server's; requests are still served one at a time.
_GCS_EMULATOR = (
    "import socketserver, sys; socketserver.TCPServer.request_queue_size = 1024; "
    "from gcp_storage_emulator.__main__ import main; main(sys.argv[1:])"
)


@contextmanager
def gcs_emulator() -> Iterator[str]:
    """gcp-storage-emulator, in memory, on a free port; yields its URL (gcsfs's
    ``endpoint_url``)."""
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "gcp-storage-emulator not found: run `bash scripts/setup.sh test`"
        ) from None
    port = free_port()
    cmd = [sys.executable, "-c", _GCS_EMULATOR, "start", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--in-memory", "-q"]
    with running(cmd, f"http://127.0.0.1:{port}/storage/v1/b", "gcp-storage-emulator") as url:
        yield url.removesuffix("/storage/v1/b")


def azurite_command() -> str:
    """Azurite's blob service: AZURITE_BLOB (a path), else what setup.sh installed, else
    one on PATH."""
    found = (
        os.environ.get("AZURITE_BLOB")
        or shutil.which("azurite-blob", path=str(REPO / ".cache/azurite/node_modules/.bin"))
        or shutil.which("azurite-blob")
    )
    if found is None:
        raise RuntimeError("azurite-blob not found: run `bash scripts/setup.sh test` (needs npm)")
    return found


@contextmanager
def azurite() -> Iterator[str]:
    """Azurite's blob service, in memory, on a free port; yields its URL (the account's
    blobs are under /devstoreaccount1)."""
    port = free_port()
    cmd = [
        azurite_command(),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--silent",
        "--skipApiVersionCheck",
        "--disableTelemetry",
    ]
    with running(cmd, f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}?comp=list", "azurite") as url:
        yield url.split(f"/{AZURITE_ACCOUNT}")[0]
