"""An HTTP listener in a daemon thread: the exporter's /metrics and the drill-down API each run one."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
