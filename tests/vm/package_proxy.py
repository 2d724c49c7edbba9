"""An HTTP proxy on the VMs' bridge to the Debian mirror, for a VM that must install packages.

The VMs have no route out (machines.py), and this host forwards no traffic. A builder that
bakes packages points its apt at this proxy, as a cluster's nodes point theirs at the
master's package cache (the common role writes the same file, 01deployer-package-cache,
and the seal removes it). It passes plain GET and HEAD requests to the mirror's host and
nothing else: what the builder installs comes from the real mirror, unchanged.
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deployer.providers.local.image import MIRROR

from .machines import GATEWAY

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._forward(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._forward(body=False)

    def _forward(self, body: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.scheme != "http" or url.hostname != self.server.allowed_host:
            self.send_error(403, f"only http://{self.server.allowed_host}/ through here")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=120)
        try:
            upstream.request(self.command, url.path + (f"?{url.query}" if url.query else ""), headers=headers)
            resp = upstream.getresponse()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            if resp.getheader("Content-Length") is None:
                self.send_header("Connection", "close")  # the end of the body is the end of the connection
                self.close_connection = True
            self.end_headers()
            if body:
                shutil.copyfileobj(resp, self.wfile, 1 << 16)
            with self.server.lock:
                self.server.requests += 1
        finally:
            upstream.close()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allowed_host = urllib.parse.urlsplit(MIRROR).hostname or ""
    requests = 0
    lock = threading.Lock()


@contextlib.contextmanager
def serving() -> Iterator[_Server]:
    """The proxy on the bridge's address (the bridge must be up), on a free port; `server_address` says which."""
    server = _Server((str(GATEWAY), 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, name="vm-package-proxy", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
