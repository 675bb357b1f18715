"""A small HTTP proxy in front of the S3 server, on loopback, that counts the bytes it serves.

Real HTTP end to end (s3fs -> proxy -> moto): nothing in s3fs or botocore is patched. Tests
point `endpoint_url` at the proxy and read `bytes_served` afterwards.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailers", "upgrade"}


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.bytes_served = 0
        self.requests: list[tuple[str, str, int]] = []  # (method, path, body bytes)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()
                with proxy._lock:
                    n = len(data) if self.command == "GET" else 0
                    proxy.bytes_served += n
                    proxy.requests.append((self.command, self.path, n))

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_served = 0
            self.requests.clear()


@contextmanager
def counting_proxy(upstream: str) -> Iterator[CountingProxy]:
    proxy = CountingProxy(upstream)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
