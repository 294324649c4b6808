"""Producers that write in transactions, on the real broker: aborted records are never counted, the
lag reaches 0 once everything committed is read (markers included), and no partition is mistaken
for a stalled one."""

from __future__ import annotations

import random
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker, kafka_tools_classpath
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Samples, Service, wait_for_messages
from tests.support.topics import create_topic, produce_in_transactions
from tests.support.wait import holds, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

Messages = list[tuple[bytes, bytes]]
PARTITIONS = 2


def copy_in_transactions(bootstrap: str, source: str, target: str) -> None:
    """Kafka's own TransactionalMessageCopier (its system tests' tool), one per partition: every
    record of `source` copied once, committed, into the same partition of `target`, with aborted
    transactions of copies in between."""
    java = shutil.which("java")
    assert java is not None, "Java is needed for the Kafka broker already"
    copiers = [subprocess.Popen(
        [java, "-Xmx128m", "-cp", kafka_tools_classpath(), "org.apache.kafka.tools.TransactionalMessageCopier",
         "--broker-list", bootstrap, "--input-topic", source, "--input-partition", str(partition),
         "--output-topic", target, "--transactional-id", f"copier-{uuid.uuid4().hex[:8]}",
         "--consumer-group", f"copier-{uuid.uuid4().hex[:8]}", "--transaction-size", "25",
         "--enable-random-aborts"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for partition in range(PARTITIONS)]
    for copier in copiers:
        output, _ = copier.communicate(timeout=180)
        assert copier.returncode == 0, output.decode(errors="replace")[-3000:]
        assert b'"remaining":0' in output, output.decode(errors="replace")[-3000:]


def aborted_records(bootstrap: str, topic: str) -> int:
    """How many records of aborted transactions the topic holds: what reading uncommitted adds."""
    ends: dict[str, int] = {}
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                                 consumer_timeout_ms=5_000)
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends[isolation] = sum(1 for _ in consumer)
        consumer.close()
    return ends["read_uncommitted"] - ends["read_committed"]


def lags(samples: Samples) -> dict[str, float]:
    return {dict(labels)["partition"]: value for (name, labels), value in samples.items()
            if name == "stream_ndcg_consumer_lag"}


def group_lags(bootstrap: str, group: str) -> dict[str, str]:
    """The group's lag per partition as Kafka's own `kafka-consumer-groups --describe` shows it."""
    java = shutil.which("java")
    assert java is not None
    described = subprocess.run(
        [java, "-Xmx128m", "-cp", kafka_tools_classpath(), "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", bootstrap, "--describe", "--group", group],
        capture_output=True, timeout=120, check=True, text=True)
    rows = [line.split() for line in described.stdout.splitlines() if line.strip()]
    header = next(row for row in rows if "LAG" in row)
    return {row[header.index("PARTITION")]: row[header.index("LAG")] for row in rows[rows.index(header) + 1:]}


def test_only_committed_transactions_count_and_the_lag_reaches_zero(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    messages = simulated(3_000, seed=27)
    copied, written = messages[:1_500], messages[1_500:]
    # Events of their own (other impression ids, other grades for the same pairs) that must never
    # count: an aborted transaction's.
    junk = simulated(3_000, seed=72)
    rng = random.Random(3)
    rng.shuffle(junk)

    source = create_topic(kafka.bootstrap, partitions=PARTITIONS)
    topic = create_topic(kafka.bootstrap, partitions=PARTITIONS)
    produce(kafka.bootstrap, source, copied)
    copy_in_transactions(kafka.bootstrap, source, topic)
    aborted = produce_in_transactions(kafka.bootstrap, topic, written, junk)
    # The situation the test is about: the topic holds aborted records, and markers after them.
    assert aborted_records(kafka.bootstrap, topic) >= aborted > 0

    env = dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d")
    service = Service(env, tmp_path)
    services.append(service)
    service.start()
    samples = wait_for_messages(service, len(messages))
    summary = replay_of(messages)
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    assert samples[("stream_ndcg_events_total", (("type", "impression"),))] == summary["events"]["impression"]

    # The lag reaches 0 on every partition within seconds, and stays there for a minute, ready throughout.
    wait_until(lambda: lags(service.scrape()) == dict.fromkeys(map(str, range(PARTITIONS)), 0.0), 15,
               lambda: f"lag 0 on every partition 15s after the last message: {lags(service.scrape())}", interval=0.5)
    # The group's offsets in Kafka follow the stored ones at most a second apart (`LagReport.COMMIT_S`),
    # committed asynchronously: they reach the end within seconds too.
    zeros = dict.fromkeys(map(str, range(PARTITIONS)), "0")
    group = env["STREAM_NDCG_GROUP_ID"]
    wait_until(lambda: group_lags(kafka.bootstrap, group) == zeros, 30,
               lambda: f"the group's lag in Kafka on every partition: {group_lags(kafka.bootstrap, group)}", interval=1)

    def caught_up() -> bool:
        samples = service.scrape()
        return set(lags(samples).values()) == {0.0} and samples[("stream_ndcg_ready", ())] == 1

    # The minute is what is tested.
    holds(caught_up, 60, lambda: f"lag 0 and ready: lags {lags(service.scrape())}", interval=2)
    assert group_lags(kafka.bootstrap, group) == zeros
    assert "rejoining" not in service.logs()
    assert service.stop() == 0
