"""Threaded HTTP servers on loopback serving a folder: one honouring Range (single byte
ranges, 206 with Content-Range, as nginx does), one ignoring it (Python's
http.server, like many static hosts: 200 and the whole file)."""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class RangeHandler(_Quiet):
    """GET with a single ``Range: bytes=a-b`` answers 206 and those bytes."""

    def send_head(self):  # type: ignore[no-untyped-def]
        found = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        path = self.translate_path(self.path)
        if found is None or os.path.isdir(path) or not os.path.exists(path):
            return super().send_head()
        size = os.path.getsize(path)
        a, b = found.groups()
        start = int(a) if a else max(0, size - int(b))
        end = min(size - 1, int(b)) if a and b else size - 1
        if start >= size:
            self.send_error(416)
            return None
        f = open(path, "rb")  # noqa: SIM115 (closed by copyfile's caller)
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.end_headers()
        return _Limited(f, end - start + 1)


class _Limited:
    """A file read up to `n` bytes (what copyfile sends of a 206)."""

    def __init__(self, f, n: int) -> None:  # type: ignore[no-untyped-def]
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        if self.n <= 0:
            return b""
        data = self.f.read(self.n if size < 0 else min(size, self.n))
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server for tests: quiet about clients that hang up, and with room
    for many connections at once."""

    # socketserver listens with a backlog of 5: 64 clients connecting at once (s3fs with
    # a larger connection pool, several ranks) would see SYNs dropped and retried a
    # second later, a delay no object store adds
    request_queue_size = 1024

    def handle_error(self, request: object, client_address: object) -> None:
        # a client that hung up mid-answer (a ranged read given up on, a stream or proxy
        # closed under it) is not the server's error: socketserver would print its
        # traceback among the tests'
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


@contextmanager
def http_server(root: Path, ranges: bool = True) -> Iterator[str]:
    """Serve `root` on a free loopback port; yields the base URL (no trailing slash)."""
    handler = functools.partial(RangeHandler if ranges else _Quiet, directory=str(root))
    server = QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
