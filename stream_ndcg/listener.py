"""An HTTP listener in a daemon thread: the exporter's /metrics and the drill-down API each run one."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def respond(handler: BaseHTTPRequestHandler, status: int, body: bytes,
            content_type: str = "text/plain; charset=utf-8", headers: Mapping[str, str] | None = None) -> None:
    """Send a whole response: status, content type and length, `headers`, then the body."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


class Listener:
    """Serves `handler` on (host, port) in a daemon thread until `close`; port 0 picks a free one."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str) -> None:
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name=name, daemon=True).start()
        self.port: int = self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
