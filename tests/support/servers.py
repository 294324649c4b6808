"""Real servers for the tiers that need them (integration, the browser's page on a running service):
a KRaft Kafka broker and redis-server on loopback, started once per session on first use.

A pytest plugin (tests/conftest.py registers it), so that every tier shares one broker in a session
that runs several; a fixture starts nothing until a test asks for it, and tests/unit asks for none.
The fixtures use the same code as `stream-ndcg dev up` (stream_ndcg.devtools.servers). Each test gets
its own topic, consumer group and Redis namespace, so tests share the servers without sharing state.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stream_ndcg.devtools.redis_servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.service import Service, killed_at_exit, service_environment


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker.start(tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    cluster = RedisClusterNodes.start(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def service_env(kafka: KafkaBroker, redis_server: RedisServer) -> dict[str, str]:
    return service_environment(kafka.bootstrap, redis_server.url)


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """The services a test starts: append each, and whatever still runs is killed after the test."""
    started: list[Service] = []
    with killed_at_exit(started):
        yield started
