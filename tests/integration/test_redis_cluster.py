"""`stream-ndcg run` on a real Redis Cluster of three masters: the same numbers as on one server."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisClusterNodes
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.engine import Engine
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect
from tests.support.batches import apply_batch, parsed
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.security import REDIS_PASSWORD, SERVICE_ACL
from tests.support.service import Service, wait_for_messages, wait_for_progress
from tests.support.store_contract import BUCKET, HORIZON, MEASURE
from tests.support.topics import create_topic, send_paced
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 6
# What a cluster client needs on top of the service's commands: the slot map and the command table.
CLUSTER_ACL = ("+cluster|slots", "+command")


def slot_owners(cluster: RedisClusterNodes) -> Callable[[str], int]:
    """Which node holds a key's slot, from the cluster's own slot map (read once)."""
    ports = [node.port for node in cluster.nodes]
    with redis.Redis(port=ports[0]) as client:
        ranges = [(start, end, ports.index(int(port)))
                  for start, end, (_, port, *_), *_ in client.execute_command("CLUSTER", "SLOTS")]

    def node_of(key: str) -> int:
        slot = key_slot(key.encode())
        return next(index for start, end, index in ranges if start <= slot <= end)

    return node_of


def test_two_instances_on_a_three_master_cluster_equal_the_replay_through_a_master_crash(
        kafka: KafkaBroker, redis_cluster: RedisClusterNodes, service_env: dict[str, str],
        services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=PARTITIONS)
    # A namespace whose partitions' hash tags fall on every master, so that each batch's reads,
    # each scrape and each multi-partition commit really cross nodes.
    node_of = slot_owners(redis_cluster)
    namespace = next(ns for ns in (f"cl-{uuid.uuid4().hex[:8]}" for _ in range(1000))
                     if len({node_of(f"{{{ns}:{topic}:{p}}}") for p in range(PARTITIONS)}) == 3)
    messages = simulated(16_000, seed=51)
    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_BATCH_SIZE="200",
               STREAM_NDCG_REDIS_URL=redis_cluster.url, STREAM_NDCG_REDIS_CLUSTER="true",
               STREAM_NDCG_NAMESPACE=namespace)
    first, second = Service(env, tmp_path), Service(env, tmp_path)
    services.extend([first, second])
    first.start()
    second.start()
    half = len(messages) // 2
    produce(kafka.bootstrap, topic, messages[:half])
    wait_for_messages(first, half)

    # kill -9 the master holding partition 0 while the second half streams in.
    victim = redis_cluster.nodes[node_of(f"{{{namespace}:{topic}:0}}")]
    sender = send_paced(kafka.bootstrap, topic, messages[half:], 2_000.0)
    # Mid-stream: the instances have taken in part of the second half, and the rest is still arriving.
    wait_for_progress(first, half + 1, 60)
    assert sender.is_alive(), "the second half was all sent before the master went away"
    victim.kill()
    wait_until(lambda: not (first.ready() and second.ready()), 30, "an instance noticing a master gone")
    victim.launch()
    redis_cluster.wait_until_healthy()
    sender.join()

    summary = replay_of(messages)
    # Each instance reports the whole topic, read from the cluster at scrape time.
    for service in (first, second):
        samples = wait_for_messages(service, len(messages), timeout=300)
        assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
        assert service.ready()
    assert "retrying" in first.logs() + second.logs()
    holding = set()
    for index, node in enumerate(redis_cluster.nodes):
        with redis.Redis(port=node.port) as client:
            if client.keys(f"{{{namespace}:*"):
                holding.add(index)
    assert holding == {0, 1, 2}
    assert first.stop() == 0
    assert second.stop() == 0


def test_an_acl_user_limited_to_the_service_commands_can_run_on_the_cluster(
        redis_cluster: RedisClusterNodes) -> None:
    user = f"svc-{uuid.uuid4().hex[:6]}"
    for node in redis_cluster.nodes:
        with redis.Redis(port=node.port) as admin:
            admin.execute_command("ACL", "SETUSER", user, *SERVICE_ACL, *CLUSTER_ACL)
    url = redis_cluster.url.replace("redis://", f"redis://{user}:{REDIS_PASSWORD}@")
    client = connect(url, cluster=True)
    store = RedisStore(client, namespace=f"acl-{uuid.uuid4().hex[:6]}", bucket_ms=BUCKET,
                       horizon_ms=HORIZON, state_ttl_ms=HORIZON, wall_clock=False)
    engine = Engine(MEASURE, BUCKET, horizon_ms=HORIZON)
    events = parsed([v for _, v in Simulator(SimulationSpec(events=500, seed=8, queries=20, rate=50.0)).messages()])
    try:
        assert store.adopt({"k": [3, 10]}) is False
        for partition in ("t:0", "t:1", "t:2"):
            epoch = store.claim(partition)
            apply_batch(store, engine, partition, events[:250], epoch=epoch, next_offset=250)
            # The drill-down reads the rows, then the row log the next commit writes.
            cursor = store.read_rows(partition, None, since_bucket=0).cursor
            apply_batch(store, engine, partition, events[250:], epoch=epoch, next_offset=500)
            assert store.read_rows(partition, cursor, since_bucket=0).rows
        assert store.counts()["impression"] > 0
        assert store.aggregates()
        assert store.clock_ms() is not None
        assert store.admit("variant", "A", 5)
        store.check()
        assert store.adopt({"k": [3, 5]}, rebuild=True) is True
    finally:
        client.close()
