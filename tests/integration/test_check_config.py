"""`check-config --connect` and `simulate` against the real broker and redis-server, and with nobody listening."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from stream_ndcg.devtools.ports import free_port
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

# The checks give up after 8 s; the process start and a JVM broker under load need the rest.
PROMPT_FAILURE_SECONDS = 20


def cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_NDCG_")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "stream_ndcg.cli", *args], capture_output=True, text=True,
                          env=environ, timeout=120, check=False)
    return proc, time.monotonic() - started


def test_connect_reports_the_topics_and_their_partitions(kafka: KafkaBroker, redis_server: RedisServer) -> None:
    topic = create_topic(kafka.bootstrap, partitions=3)
    dead_letters = create_topic(kafka.bootstrap, partitions=1)
    proc, _ = cli("check-config", "--connect", "--bootstrap-servers", kafka.bootstrap, "--redis-url",
                  redis_server.url, "--topics", topic, "--dead-letter-topic", dead_letters)
    assert proc.returncode == 0, proc.stderr
    assert f"kafka: topic {topic}: 3 partitions" in proc.stderr
    assert f"kafka: dead-letter topic {dead_letters}: 1 partitions" in proc.stderr
    assert f"redis: reached {redis_server.url}" in proc.stderr
    assert '"topics": [' in proc.stdout  # stdout stays the JSON of the settings


def test_connect_names_a_missing_topic_without_creating_it(kafka: KafkaBroker, redis_server: RedisServer) -> None:
    present = create_topic(kafka.bootstrap)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    proc, _ = cli("check-config", "--connect", "--bootstrap-servers", kafka.bootstrap, "--redis-url",
                  redis_server.url, "--topics", f"{present},{missing}")
    assert proc.returncode == 1
    assert f"kafka: topic {present}: 1 partitions" in proc.stderr
    assert (f"stream-ndcg check-config: Kafka topic {missing!r}: UnknownTopicOrPartitionError (create it, or grant "
            "this user access to it)") in proc.stderr
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        assert missing not in admin.list_topics()
    finally:
        admin.close()


def test_connect_fails_promptly_when_nobody_listens(kafka: KafkaBroker, redis_server: RedisServer) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    proc, seconds = cli("check-config", "--connect", "--bootstrap-servers", nobody, "--redis-url",
                        redis_server.url)
    assert proc.returncode == 1
    assert seconds < PROMPT_FAILURE_SECONDS
    assert f"stream-ndcg check-config: Kafka unreachable at {nobody} with security_protocol=PLAINTEXT" in proc.stderr
    assert f"redis: reached {redis_server.url}" in proc.stderr

    topic = create_topic(kafka.bootstrap)
    proc, seconds = cli("check-config", "--connect", "--bootstrap-servers", kafka.bootstrap, "--topics", topic,
                        "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert proc.returncode == 1
    assert seconds < PROMPT_FAILURE_SECONDS
    assert f"kafka: topic {topic}: 1 partitions" in proc.stderr
    assert "stream-ndcg check-config: Redis unreachable at redis://127.0.0.1:" in proc.stderr


def test_connect_tries_the_redis_credentials(kafka: KafkaBroker, redis_server: RedisServer) -> None:
    user = f"check-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser(user, enabled=True, passwords=["+right-Password-1"], commands=["+ping", "+info", "+hello",
                                                                                    "+auth"])
    topic = create_topic(kafka.bootstrap)
    try:
        url = f"redis://{user}:wrong-Password-2@127.0.0.1:{redis_server.port}/0"
        proc, _ = cli("check-config", "--connect", "--bootstrap-servers", kafka.bootstrap, "--topics", topic,
                      "--redis-url", url)
        assert proc.returncode == 1
        assert "wrong-Password-2" not in proc.stderr + proc.stdout
        assert f"Redis unreachable at redis://{user}:***@127.0.0.1:{redis_server.port}/0: Authentication" \
            in proc.stderr
        proc, _ = cli("check-config", "--connect", "--bootstrap-servers", kafka.bootstrap, "--topics", topic,
                      "--redis-url", url.replace("wrong-Password-2", "right-Password-1"))
        assert proc.returncode == 0, proc.stderr
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_simulate_sends_to_the_broker(kafka: KafkaBroker) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    proc, _ = cli("simulate", "--events", "300", "--topic", topic, "--bootstrap-servers", kafka.bootstrap,
                  "--security-protocol", "PLAINTEXT")
    assert proc.returncode == 0, proc.stderr
    assert f"sent 300 messages to {topic}" in proc.stderr
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(2)])
    finally:
        consumer.close()
    assert sum(ends.values()) == 300


def test_simulate_without_a_broker_fails_in_seconds() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    proc, seconds = cli("simulate", "--events", "10", "--bootstrap-servers", nobody)
    assert proc.returncode == 1
    assert seconds < PROMPT_FAILURE_SECONDS
    assert f"stream-ndcg simulate: no Kafka broker answered at {nobody} within 8 s" in proc.stderr
    assert "Traceback" not in proc.stderr
