"""Where the leaders are: a partition's Kafka leader, the active KRaft controller, a key's Redis
Cluster master, and whether every replica is back in sync, asked of the nodes running now."""

from __future__ import annotations

import functools
import gc
import warnings
from typing import Any

import redis
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from stream_ndcg.devtools.redis_servers import RedisClusterNodes, RedisServer
from stream_ndcg.devtools.servers import KafkaCluster
from tests.support.wait import wait_until

# While a cluster moves its leaders a request may fail: that is "not yet".
eventually = functools.partial(wait_until, ignoring=(KafkaError, redis.RedisError, OSError))


def admin_of(cluster: KafkaCluster) -> KafkaAdminClient:
    """An admin client of the nodes running now (kafka-python gives up on a bootstrap that refuses)."""
    live = [node.bootstrap for node in cluster.nodes if node.process is not None]
    return KafkaAdminClient(bootstrap_servers=live, request_timeout_ms=10_000)


def fully_replicated(cluster: KafkaCluster, topics: list[str] | None = None) -> bool:
    """Every partition of `topics` (None: of every topic, the internal ones included) has a leader
    and all of the cluster's nodes in sync."""
    admin = admin_of(cluster)
    try:
        described = admin.describe_topics(topics)
    finally:
        admin.close()
    size = len(cluster.nodes)
    return bool(described) and all(
        not topic["error_code"]
        and all(p["leader_id"] >= 0 and len(p["isr_nodes"]) == size for p in topic["partitions"])
        for topic in described)


def leader_of(cluster: KafkaCluster, topic: str, partition: int) -> int:
    admin = admin_of(cluster)
    try:
        [described] = admin.describe_topics([topic])
    finally:
        admin.close()
    leader: int = next(p["leader_id"] for p in described["partitions"] if p["partition_index"] == partition)
    return leader


def active_controller(cluster: KafkaCluster) -> int:
    admin = admin_of(cluster)
    try:
        quorum: dict[str, Any] = admin.describe_metadata_quorum()
    finally:
        admin.close()
    leader: int = quorum["topics"][0]["partitions"][0]["leader_id"]
    return leader


def master_of(cluster: RedisClusterNodes, key: str) -> RedisServer:
    """The node that serves `key`'s slot now."""
    client = redis.RedisCluster.from_url(next(n.url for n in cluster.nodes if n.process is not None))
    try:
        port = client.get_node_from_key(key).port  # type: ignore[no-untyped-call]
    finally:
        client.close()
    return next(node for node in cluster.nodes if node.port == port)


def collect_refused_sockets() -> None:
    """redis-py's connections to a killed node, and kafka-python's to a stopped one: collected where
    the test made them, their ResourceWarning ignored, rather than reported against a later test
    (pyproject.toml ignores the sockets that never connected wherever they are collected)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
