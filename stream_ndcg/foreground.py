"""How each service runs in the foreground: metrics served, SIGTERM and Ctrl-C asking its loop to
stop after the cycle in flight, and what it opened closed on the way out.

`stream-ndcg run`, `judge` and `ubi-bridge` each build a loop and hand it here:

    processor, exporter = build(settings)
    return run_in_foreground(processor, lambda ready: exporter.serve(host, port, ready), settings.metrics_host,
                             closing=[exporter.close])
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

logger = logging.getLogger(__name__)


class Loop(Protocol):
    def run(self) -> None:
        """Work until `shutdown`, then close its source."""
        ...

    def shutdown(self, *_: object) -> None:
        """Ask `run` to stop (safe from a signal handler)."""
        ...

    def ready(self) -> bool: ...


def run_in_foreground(loop: Loop, serve: Callable[[Callable[[], bool]], int], host: str, *,
                      closing: Sequence[Callable[[], None]] = ()) -> int:
    """Serve the metrics (`serve` takes the loop's readiness and returns the port bound), run the
    loop until SIGTERM or SIGINT, then call each of `closing`, in order, however the loop ended;
    the exit status: 0."""
    port = serve(loop.ready)
    logger.info("metrics on http://%s:%d/metrics", host, port)
    signal.signal(signal.SIGTERM, loop.shutdown)
    signal.signal(signal.SIGINT, loop.shutdown)
    try:
        loop.run()
    finally:
        for close in closing:
            close()
    return 0
