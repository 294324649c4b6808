"""/metrics, /healthz and /readyz over HTTP: what `Exporter.serve` and `ubi-bridge` listen with."""

from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from stream_ndcg.listener import Listener, respond

logger = logging.getLogger(__name__)


def serve_metrics(registry: CollectorRegistry, host: str, port: int, ready: Callable[[], bool]) -> Listener:
    """/metrics of `registry`, /healthz and /readyz (200 while `ready()`), in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            respond(self, status, body, content_type)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            logger.debug("http: " + format, *args)

    return Listener(Handler, host, port, "metrics-http")
