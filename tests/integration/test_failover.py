"""Kafka's own failures on a three-node KRaft cluster: the leader of a partition killed mid-stream,
then the active controller. The service follows the new leaders and its numbers still equal the
replay, with nothing lost or counted twice."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import NewTopic

from stream_ndcg.devtools.servers import KafkaCluster
from tests.support.failover import (
    active_controller,
    admin_of,
    collect_refused_sockets,
    eventually,
    fully_replicated,
    leader_of,
)
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, progress, service_environment, wait_for_messages

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 3


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster.start(tmp_path_factory.mktemp("kafka-cluster"), size=3)
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def refused_sockets_collected() -> Iterator[None]:
    yield
    collect_refused_sockets()


def send_idempotent(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float,
                    failures: list[BaseException]) -> threading.Thread:
    """Send at `rate` a second, idempotently (a retry after a leader change writes nothing twice),
    every send confirmed; what failed is put in `failures`."""
    def run() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all", enable_idempotence=True,
                                 linger_ms=20, retries=2**31 - 1, delivery_timeout_ms=120_000)
        started = time.monotonic()
        futures = []
        for sent, (key, value) in enumerate(messages):
            wait = started + sent / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            futures.append(producer.send(topic, key=key, value=value))
        producer.flush()
        for future in futures:
            try:
                future.get(timeout=60)
            except Exception as exc:  # noqa: BLE001 - recorded for the test to fail on
                failures.append(exc)
        producer.close()

    sender = threading.Thread(target=run)
    sender.start()
    return sender


def test_the_service_follows_a_killed_leader_and_a_controller_failover(
        kafka_cluster: KafkaCluster, redis_server: Any, services: list[Service], tmp_path: Path) -> None:
    topic = f"events-{uuid.uuid4().hex[:10]}"
    admin = admin_of(kafka_cluster)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])
    finally:
        admin.close()
    eventually(lambda: fully_replicated(kafka_cluster, [topic]), 60, "the topic's replicas in sync")
    messages = simulated(6_000, seed=31)
    env = service_environment(kafka_cluster.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_WINDOWS="1d")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    failures: list[BaseException] = []
    sender = send_idempotent(kafka_cluster.bootstrap, topic, messages, rate=150.0, failures=failures)

    eventually(lambda: progress(service) >= 1_000, 90, "the first 1,000 messages taken in")
    leader = leader_of(kafka_cluster, topic, 0)
    kafka_cluster.node(leader).kill()
    # What the test is about: partition 0 is led by another node now.
    eventually(lambda: leader_of(kafka_cluster, topic, 0) not in (leader, -1), 60, "a new leader of partition 0")
    before = progress(service)
    eventually(lambda: progress(service) >= before + 500, 90, "taking in after the leader was killed")
    kafka_cluster.node(leader).relaunch()
    eventually(lambda: fully_replicated(kafka_cluster, [topic, "__consumer_offsets"]), 120,
               "the relaunched node back in sync")

    controller = active_controller(kafka_cluster)
    kafka_cluster.node(controller).kill()
    eventually(lambda: active_controller(kafka_cluster) not in (controller, -1), 60, "a new active controller")
    before = progress(service)
    eventually(lambda: progress(service) >= min(before + 500, len(messages)), 90,
               "taking in after the controller was killed")
    kafka_cluster.node(controller).relaunch()

    sender.join(timeout=300)
    assert not sender.is_alive() and not failures, failures[:3]
    samples = wait_for_messages(service, len(messages), timeout=300)
    summary = replay_of(messages)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    eventually(lambda: service.ready(), 60, "the service ready again")
    assert service.stop() == 0


def test_check_config_warns_of_a_dead_letter_topic_less_durable_than_the_input(
        kafka_cluster: KafkaCluster, redis_server: Any) -> None:
    names = {role: f"{role}-{uuid.uuid4().hex[:8]}" for role in ("events", "thin", "lax", "sound")}
    admin = admin_of(kafka_cluster)
    try:
        admin.create_topics([NewTopic(names["events"], 2, 3), NewTopic(names["thin"], 1, 1),
                             NewTopic(names["lax"], 1, 3, topic_configs={"min.insync.replicas": "1"}),
                             NewTopic(names["sound"], 1, 3)])
    finally:
        admin.close()
    eventually(lambda: fully_replicated(kafka_cluster, [names["events"], names["lax"], names["sound"]]), 60,
               "the topics' replicas in sync")

    def warnings_for(dead_letters: str) -> list[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_NDCG_")}
        proc = subprocess.run(
            [sys.executable, "-m", "stream_ndcg.cli", "check-config", "--connect", "--bootstrap-servers",
             kafka_cluster.bootstrap, "--redis-url", redis_server.url, "--topics", names["events"],
             "--dead-letter-topic", dead_letters], capture_output=True, text=True, env=environ, timeout=120,
            check=False)
        assert proc.returncode == 0, proc.stderr
        assert f"kafka: topic {names['events']}: 2 partitions, 3 replicas" in proc.stderr
        return [line for line in proc.stderr.splitlines() if line.startswith("kafka: warning:")]

    [thin] = warnings_for(names["thin"])
    assert "1 replicas, fewer than the input topics' 3" in thin
    [lax] = warnings_for(names["lax"])
    assert "min.insync.replicas=1, lower than the input topics' 2" in lax
    assert warnings_for(names["sound"]) == []
