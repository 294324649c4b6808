"""A Kafka broker and a redis-server on loopback, started for one bench run and stopped after it.

    with kafka_and_redis("service") as (kafka, redis_server):
        ServiceProcess(kafka.bootstrap, redis_server.url, ...)
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker


@contextmanager
def redis_server(name: str) -> Iterator[RedisServer]:
    """A redis-server in a temporary directory of its own, named after the bench."""
    with tempfile.TemporaryDirectory(prefix=f"stream-ndcg-{name}-bench-") as root, \
            RedisServer.start(Path(root, "redis")) as server:
        yield server


@contextmanager
def kafka_and_redis(name: str) -> Iterator[tuple[KafkaBroker, RedisServer]]:
    """A single-node KRaft broker and a redis-server, in a temporary directory of their own."""
    with tempfile.TemporaryDirectory(prefix=f"stream-ndcg-{name}-bench-") as root, \
            KafkaBroker.start(Path(root, "kafka")) as kafka, RedisServer.start(Path(root, "redis")) as server:
        yield kafka, server


def redis_version() -> str:
    """The installed redis-server's version, as a section's header gives it."""
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
    return next((part.split("=")[1] for part in out.split() if part.startswith("v=")), "?")
