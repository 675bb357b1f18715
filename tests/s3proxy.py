"""A small HTTP proxy in front of an object store's server (S3's moto, the GCS and Azure
emulators, a plain HTTP server), on loopback: counts bytes, injects faults, shapes the
network.

Real HTTP end to end (s3fs -> proxy -> moto): nothing in s3fs or botocore is patched.
Faults also play the servers that misbehave: one ignoring ``Range`` (the header is
dropped on the way, the server answers 200 and the whole object), one sending a shorter
or a shifted range than asked (the header is changed on the way; the answer's
``Content-Range`` truthfully names what was sent), one refusing requests that carry no
``Authorization`` (as GCS does; its emulator checks no credentials).
Tests and scripts.bench point `endpoint_url` at the proxy; afterwards `bytes_served` says what
was fetched. With faults on, a seeded random draw per GET answers 503 SlowDown, or sends
the headers and half the body and then drops the connection (a reset mid-body). With
shaping on, every answer waits `latency_ms` before its first byte and each connection's
body flows at most `mbps` MB/s: a local server behaves like a remote object store.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TypeVar
from urllib.parse import urlsplit

from tests.httpd import QuietServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailers", "upgrade"}
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")
_UNAUTHORIZED = (
    b'{"error": {"code": 401, "message": "Anonymous caller does not have '
    b'storage.objects.get access to the object."}}'
)
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Faults:
    """What share of GETs fail, and how."""

    slowdown: float = 0.0  # answer 503 SlowDown
    reset: float = 0.0  # send half the body, then drop the connection
    every_get: bool = False  # answer 503 to every GET
    seed: int = 0
    range_edit: str | None = None  # "drop", "short" (half) or "shifted" (+1): the Range asked
    unauthorized: int = 0  # answer this status to requests without an Authorization header


@dataclass(frozen=True)
class Shaping:
    """What the network between client and store adds: a delay before each answer's first
    byte (S3's time to first byte is 20-50 ms), and a rate cap per connection (S3 gives
    each connection about 50-100 MB/s)."""

    latency_ms: float = 0.0
    mbps: float = 0.0  # 0: no cap
    listing_ms: float = 0.0  # more before a listing's answer (a store slow to list)

    @property
    def on(self) -> bool:
        return self.latency_ms > 0 or self.mbps > 0 or self.listing_ms > 0


# the latency of the tests that count round trips in line: longer than the work a loaded
# machine does between two requests of one chain (at 40 ms, a mixture's second stream
# starting its reads late on a busy machine stood one round trip more in line)
IN_LINE = Shaping(latency_ms=150)

T = TypeVar("T")


def least_in_line(start: Callable[[], T], count: Callable[[T], int], want: int) -> T:
    """What a start gave whose requests stood `want` in line (`count` of it), of up to 3
    starts, each a new job's: the first counted at most `want` (asserted equal; each
    start's count named where none is). Load can lengthen a chain but never shorten one: a
    request sent after an answer arrives after it, but one a loaded machine sends late (a
    thread not run for 150 ms) arrives after answers it did not wait for (4 where 3 stood,
    once in CI). So the least of a few starts is the structure's count, and a start that
    needs more in line fails every try."""
    counts: list[int] = []
    while True:
        got = start()
        counts.append(count(got))
        if counts[-1] <= want or len(counts) == 3:
            assert counts[-1] == want, f"in line, each start: {counts}"
            return got


_SLICE = 64 << 10  # a shaped body is written in slices of this many bytes


class CountingProxy:
    def __init__(
        self, upstream: str, faults: Faults | None = None, shaping: Shaping | None = None
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults = faults or Faults()
        self.shaping = shaping or Shaping()
        self.rng = random.Random(self.faults.seed)
        self.bytes_served = 0
        self.injected = {"slowdown": 0, "reset": 0}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, body bytes)
        self.get_headers: list[dict[str, str]] = []  # the headers of each GET, in order
        self.gets: list[tuple[str, str | None]] = []  # (path, Range header) of each GET
        self.faulted: list[tuple[str, str]] = []  # (fault, path) of each injected fault
        # (method, path, Range, arrived, answered: time.monotonic()) of each answered request
        self.timeline: list[tuple[str, str, str | None, float, float]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()  # open client connections
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._connections.add(self.connection)

            def finish(self) -> None:
                with proxy._lock:
                    proxy._connections.discard(self.connection)
                super().finish()

            def _forward(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._draw() if self.command == "GET" else None
                if self.command == "GET":
                    with proxy._lock:
                        proxy.get_headers.append(dict(self.headers.items()))
                        proxy.gets.append((self.path.split("?")[0], self.headers.get("Range")))
                if fault is not None:
                    with proxy._lock:
                        proxy.faulted.append((fault, self.path))
                if fault == "slowdown":
                    self._answer(503, _SLOWDOWN, {"Content-Type": "application/xml"})
                    return
                refuse = proxy.faults.unauthorized
                if refuse and not self.headers.get("Authorization"):
                    with proxy._lock:
                        proxy.faulted.append(("unauthorized", self.path))
                    self._answer(refuse, _UNAUTHORIZED, {"Content-Type": "application/json"})
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if self.command == "GET" and proxy._edit_range(headers):
                    with proxy._lock:
                        proxy.faulted.append((f"range {proxy.faults.range_edit}", self.path))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    kept = {
                        k: v
                        for k, v in resp.getheaders()
                        if k.lower() not in _HOP and k.lower() != "content-length"
                    }
                    # a HEAD answer has no body but announces the object's length
                    declared = int(resp.getheader("Content-Length") or len(data))
                finally:
                    conn.close()
                if fault == "reset" and len(data) > 1:
                    self._answer(resp.status, data, kept, cut=len(data) // 2)
                    return
                self._answer(resp.status, data, kept, declared)
                with proxy._lock:
                    n = len(data) if self.command == "GET" else 0
                    proxy.bytes_served += n
                    proxy.requests.append((self.command, self.path, n))
                    rng = headers.get("Range") or headers.get("range")
                    proxy.timeline.append((self.command, self.path, rng, arrived, time.monotonic()))

            def _answer(
                self,
                status: int,
                data: bytes,
                headers: dict[str, str],
                length: int | None = None,
                cut: int | None = None,
            ) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                shape = proxy.shaping
                if shape.latency_ms:
                    time.sleep(shape.latency_ms / 1000)
                if shape.listing_ms and "list-type=" in self.path:
                    time.sleep(shape.listing_ms / 1000)
                self.end_headers()
                if self.command == "HEAD":
                    return
                if cut is None and shape.mbps:
                    start = time.monotonic()
                    for at in range(0, len(data), _SLICE):
                        self.wfile.write(data[at : at + _SLICE])
                        due = start + (at + _SLICE) / (shape.mbps * 1e6)
                        time.sleep(max(0.0, due - time.monotonic()))
                    return
                if cut is None:
                    self.wfile.write(data)
                    return
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def object_bytes(self) -> int:
        """Body bytes of the GETs of objects: `bytes_served` less S3's listings (a GET of
        a bucket with ``list-type=2``, which s3fs lists with)."""
        with self._lock:
            return sum(n for m, p, n in self.requests if m == "GET" and "list-type=" not in p)

    def in_line(self, since: float = 0.0, until: float = float("inf")) -> int:
        """How many of the requests that arrived in [since, until] stood in line: the
        longest chain of them in which each arrived after the one before was answered."""
        with self._lock:
            spans = sorted((a, b) for _, _, _, a, b in self.timeline if since <= a <= until)
        depth: list[tuple[float, int]] = []  # (answered, chain length ending there)
        for arrived, answered in spans:
            before = max((d for end, d in depth if end <= arrived), default=0)
            depth.append((answered, before + 1))
        return max((d for _, d in depth), default=0)

    def _edit_range(self, headers: dict[str, str]) -> bool:
        """The Range header as `faults.range_edit` says: dropped, halved or shifted
        (whether it was changed)."""
        edit = self.faults.range_edit
        # Azure's SDK asks with x-ms-range, the others with Range
        name = next((k for k in headers if k.lower() in ("range", "x-ms-range")), None)
        found = _RANGE.fullmatch(headers.get(name or "", "").strip())
        if edit is None or name is None or found is None:
            return False
        first, last = int(found.group(1)), int(found.group(2))
        if edit == "drop":
            del headers[name]
        elif edit == "short" and last > first:
            headers[name] = f"bytes={first}-{first + (last - first) // 2}"
        elif edit == "shifted":
            headers[name] = f"bytes={first + 1}-{last + 1}"
        return True

    def _draw(self) -> str | None:
        with self._lock:
            if self.faults.every_get:
                self.injected["slowdown"] += 1
                return "slowdown"
            x = self.rng.random()
            if x < self.faults.slowdown:
                self.injected["slowdown"] += 1
                return "slowdown"
            if x < self.faults.slowdown + self.faults.reset:
                self.injected["reset"] += 1
                return "reset"
            return None


@contextmanager
def counting_proxy(
    upstream: str, faults: Faults | None = None, shaping: Shaping | None = None
) -> Iterator[CountingProxy]:
    """A proxy to `upstream` on a free loopback port, serving from a thread until the
    block ends."""
    proxy = CountingProxy(upstream, faults, shaping)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
        # and the kept-alive connections: a closed proxy is a dead endpoint, not one that
        # still answers on the connections its clients pooled
        with proxy._lock:
            for connection in list(proxy._connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
