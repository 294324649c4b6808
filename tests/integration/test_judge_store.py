"""The Redis judge store meets the judge-store contract, on one server and on a cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.errors import ConfigError
from stream_ndcg.state.judge_redis import RedisJudgeStore
from stream_ndcg.state.judge_store import JudgeStore
from stream_ndcg.state.redis_reads import connect
from tests.support.judge_store_contract import JudgeStoreContract

pytestmark = pytest.mark.redis


class TestRedisJudgeStore(JudgeStoreContract):
    @pytest.fixture(params=["redis", "redis-cluster"])
    def store(self, request: pytest.FixtureRequest) -> Iterator[JudgeStore]:
        cluster = request.param == "redis-cluster"
        server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
        client = connect(server.url, cluster=cluster)
        yield RedisJudgeStore(client, namespace=f"j-{uuid.uuid4().hex[:8]}")
        if isinstance(client, redis.RedisCluster):
            # close() leaves the nodes' pooled connections open, for the collector to find.
            client.disconnect_connection_pools()  # type: ignore[no-untyped-call]
        client.close()


def test_judge_state_in_another_format_is_refused(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    namespace = f"j-{uuid.uuid4().hex[:8]}"
    client.set(f"{{{namespace}}}:judge:format", "9")
    with pytest.raises(ConfigError, match="format version '9'"):
        RedisJudgeStore(client, namespace=namespace).adopt()
    client.close()
