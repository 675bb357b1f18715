"""Shared fixtures: real object stores on 127.0.0.1 (moto's S3 server, gcp-storage-emulator,
Azurite, a plain HTTP server), and torchrun."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.emulators import free_port, running

REPO = Path(__file__).resolve().parents[1]


def _moto_server_command(port: int) -> list[str]:
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which(
        "moto_server"
    )
    if exe is None:
        raise RuntimeError("moto_server not found: install the test extra (pip install -e .[test])")
    return [exe, "-H", "127.0.0.1", "-p", str(port)]


@contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """A moto S3 server on a free 127.0.0.1 port; yields its URL, stops it afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(_moto_server_command(port), f"{url}/moto-api/", "moto_server", env):
        yield url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server started for this test session, stopped at its end."""
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_auth_endpoint() -> Iterator[str]:
    """A moto S3 server that checks credentials (IAM auth on from the first request): the
    tests' fake keys get a real 403 from it."""
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as url:
        yield url


@dataclass(frozen=True)
class S3:
    """A fresh, empty S3 endpoint for one test, with fake credentials in the environment."""

    endpoint_url: str

    @property
    def storage_options(self) -> dict[str, object]:
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}}

    def fs(self):  # type: ignore[no-untyped-def]
        import s3fs

        return s3fs.S3FileSystem(
            client_kwargs={"endpoint_url": self.endpoint_url}, skip_instance_cache=True
        )


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """The session's S3 server, reset to empty, with fake credentials set for this test only."""
    req = urllib.request.Request(f"{s3_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield S3(s3_endpoint)
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """URL of a gcp-storage-emulator started for this test session."""
    from tests.emulators import gcs_emulator

    with gcs_emulator() as url:
        yield url


@pytest.fixture(scope="session")
def azurite_endpoint() -> Iterator[str]:
    """URL of an Azurite blob service started for this test session."""
    from tests.emulators import azurite

    with azurite() as url:
        yield url


STORES = ["s3", "gcs", "azure", "http"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """Each object store in turn (tests/stores.py), with a fresh bucket for this test."""
    from .httpd import http_server
    from .stores import new_bucket

    kind = request.param
    if kind == "s3":
        yield new_bucket("s3", request.getfixturevalue("s3").endpoint_url)
    elif kind == "gcs":
        yield new_bucket("gcs", request.getfixturevalue("gcs_endpoint"))
    elif kind == "azure":
        yield new_bucket("azure", request.getfixturevalue("azurite_endpoint"))
    else:
        folder = tmp_path / "served"
        folder.mkdir()
        with http_server(folder, ranges=True) as url:
            yield new_bucket("http", url, folder)
    for name in ("gcsfs.core", "adlfs"):  # the filesystems a test opened: none outlive it
        module = sys.modules.get(name)
        if module is not None:
            cls = module.GCSFileSystem if name == "gcsfs.core" else module.AzureBlobFileSystem
            cls.clear_instance_cache()


def _tree(root: int) -> list[int]:
    """`root` and every process descended from it (found by their parents in /proc:
    descendants that started sessions of their own are no process group's)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, rest = stat.read_text().rsplit(") ", 1)  # (a name may hold ") ")
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(rest.split()[1]), []).append(int(head.split(" (")[0]))
    todo, tree = [root], []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stacks_then_kill(root: int) -> None:
    """A process tree that hangs: each of its Python processes prints every thread's stack
    to its stderr (faulthandler, on SIGABRT; the tree runs with PYTHONFAULTHANDLER=1), then
    all are killed. The tree is found first: a rank whose torchrun died is no child of it."""
    tree = _tree(root)
    _signal(tree[1:], signal.SIGABRT)  # the ranks and their workers; torchrun's stack is
    time.sleep(3)  # of no interest, and it would stop the ranks on its way down
    _signal(tree, signal.SIGKILL)


def torchrun(
    script: str | Path, *args: str, nproc: int = 2, timeout: float = 180, env: dict | None = None
) -> list[str]:
    """Run `script` under torchrun with `nproc` local processes (gloo on the CPU).

    Returns each rank's stdout, read from torchrun's per-rank log files, so that lines of
    different ranks never interleave.
    """
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
        "PYTHONFAULTHANDLER": "1",  # a hang's stacks (_stacks_then_kill)
        **(env or {}),
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(name, None)
    with tempfile.TemporaryDirectory() as logs:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            f"--log-dir={logs}",
            "--redirects=3",
            str(script),
            *args,
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=REPO
        )
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # torchrun starts each rank in a session of its own: killing torchrun alone
            # left the ranks (and their DataLoader workers) running after the test
            _stacks_then_kill(proc.pid)
            _, stderr = proc.communicate()
            logged = sorted(Path(logs).rglob("std*.log"))
            ranks = "".join(f"--- {p.parent.name} {p.name}:\n{p.read_text()}" for p in logged)
            raise AssertionError(
                f"torchrun {script} {args} ran past {timeout} s: its processes were killed "
                f"(each rank's stacks, from faulthandler, in its stderr)\n{stderr}\n{ranks}"
            ) from None
        outs = {p.parent.name: p.read_text() for p in Path(logs).rglob("stdout.log")}
        errs = "".join(p.read_text() for p in Path(logs).rglob("stderr.log"))
    if proc.returncode != 0:
        raise AssertionError(
            f"torchrun {script} {args} failed ({proc.returncode}):\n{stderr}\n{errs}"
        )
    return [outs[str(rank)] for rank in range(nproc)]
