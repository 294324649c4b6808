"""Records Kafka deleted before the service read them (it was down longer than the topic's retention,
or somebody ran delete-records) are said aloud: skipped with a WARNING and a count, or, with
fail_on_data_loss, the partition is not read and the service stays not ready."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.state.redis import RedisStore
from stream_ndcg.state.redis_reads import connect
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of, simulated
from tests.support.service import Service, settled, wait_for_messages
from tests.support.topics import create_topic
from tests.support.wait import holds, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def read_range(bootstrap: str, topic: str, partition: int, start: int, stop: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < stop - start and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500).get(tp, []):
                if record.offset < stop:
                    values.append(record.value)
        assert len(values) == stop - start
        return values
    finally:
        consumer.close()


def first_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The log start offset of each partition: the first record Kafka still holds."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {tp.partition: offset for tp, offset in consumer.beginning_offsets(partitions).items()}
    finally:
        consumer.close()


def stored_offset(service: Service, partition: str) -> int | None:
    """The next offset the service's state holds for a partition: where it resumes."""
    env = service.env
    store = RedisStore(connect(env["STREAM_NDCG_REDIS_URL"]), namespace=env["STREAM_NDCG_NAMESPACE"],
                       bucket_ms=60_000, horizon_ms=86_400_000, state_ttl_ms=86_400_000)
    try:
        return store.next_offset(partition)
    finally:
        store.client.close()


@dataclass
class Loss:
    """What Kafka still delivers after the deletion, and where."""

    kept: list[tuple[bytes, bytes]]
    # Offsets of partition 0 deleted before the service read them.
    lost: int
    # Records of partition 1 produced while the service was down: all still there.
    unread_elsewhere: int


def lose_records(kafka: KafkaBroker, service: Service, topic: str) -> Loss:
    """Consume a first half, stop, produce a second half and delete part of it from partition 0
    before the service comes back."""
    messages = simulated(4_000, seed=23, malformed=0.0)
    first, second = messages[:2_000], messages[2_000:]
    service.start()
    produce(kafka.bootstrap, topic, first)
    wait_for_messages(service, len(first))
    assert service.stop() == 0
    stored = end_offsets(kafka.bootstrap, topic)
    produce(kafka.bootstrap, topic, second)
    ends = end_offsets(kafka.bootstrap, topic)
    cut = (stored[0] + ends[0]) // 2
    assert cut > stored[0]
    lost = Counter(read_range(kafka.bootstrap, topic, 0, stored[0], cut))
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): cut})
    finally:
        admin.close()
    # The situation the tests are about: the service's state resumes partition 0 at an offset Kafka
    # no longer holds, and the records from there to the cut are gone.
    assert stored_offset(service, f"{topic}:0") == stored[0]
    assert first_offsets(kafka.bootstrap, topic)[0] == cut > stored[0]
    kept = []
    for key, value in messages:
        if lost[value]:
            lost[value] -= 1
        else:
            kept.append((key, value))
    return Loss(kept, cut - stored[0], ends[1] - stored[1])


def test_records_deleted_before_they_were_read_are_skipped_counted_and_logged(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    service = Service({**service_env, "STREAM_NDCG_TOPICS": topic, "STREAM_NDCG_WINDOWS": "1d"}, tmp_path)
    services.append(service)
    loss = lose_records(kafka, service, topic)
    kept, lost = loss.kept, loss.lost
    service.start()
    samples = wait_for_messages(service, len(kept))
    assert samples[("stream_ndcg_offsets_skipped_total", (("partition", "0"), ("topic", topic)))] == lost
    assert f"{topic}:0: {lost} offsets" in service.logs()
    assert "were deleted from Kafka before they were read" in service.logs()
    assert expect_equal_to_replay(samples, replay_of(kept), "1d", CUTOFFS) == compared_gauges()
    assert service.becomes_ready(), service.logs()[-3000:]
    assert service.stop() == 0


def test_with_fail_on_data_loss_the_partition_is_not_read_and_the_service_not_ready(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2)
    service = Service({**service_env, "STREAM_NDCG_TOPICS": topic, "STREAM_NDCG_WINDOWS": "1d",
                       "STREAM_NDCG_FAIL_ON_DATA_LOSS": "true"}, tmp_path)
    services.append(service)
    loss = lose_records(kafka, service, topic)
    assert loss.unread_elsewhere > 0, "partition 1 has nothing new to go on with"
    service.start()
    wait_until(lambda: "not reading the partition" in service.logs(), 60, lambda: service.logs()[-3000:])
    # Partition 1 goes on to its end; partition 0 stays where it was, and the service not ready.
    readable = 2_000 + loss.unread_elsewhere
    wait_until(lambda: settled(service.scrape()) >= readable, 60,
               lambda: f"{readable} messages taken in: all but partition 0's\n{service.logs()[-3000:]}")
    assert readable < len(loss.kept)

    def halted() -> bool:
        samples = service.scrape()
        return settled(samples) == readable and samples[("stream_ndcg_ready", ())] == 0 and not service.ready()

    holds(halted, 3, lambda: f"partition 0 not read, the service not ready\n{service.logs()[-3000:]}")
    # Said once each time the group hands the partition over, not on every poll.
    logs = service.logs().rpartition("metrics on http")[2]  # the second run's
    assert logs.count("not reading the partition") == logs.count(f"assigned {topic}:0")
    assert service.stop() == 0
