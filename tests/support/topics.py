"""A Kafka topic of its own for each test, and traffic sent to it while the test goes on."""

from __future__ import annotations

import threading
import uuid

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from stream_ndcg.devtools.producer import produce
from tests.support.wait import wait_until


def create_topic(bootstrap: str, partitions: int = 1, replication: int = 1,
                 configs: dict[str, str] | None = None) -> str:
    """A new topic (with the topic `configs` given), returned once every partition has a leader
    (consumers then see all of them)."""
    name = f"events-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, replication, topic_configs=configs or {})])

        def led() -> bool:
            described = admin.describe_topics([name])
            leaders = [p.get("leader_id", -1) for p in described[0].get("partitions", [])] if described else []
            return len(leaders) == partitions and all(leader >= 0 for leader in leaders)

        wait_until(led, 30, f"a leader for each of the {partitions} partitions of {name}")
    finally:
        admin.close()
    return name


def send_paced(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float) -> threading.Thread:
    """Start sending `messages` at `rate` per second in a thread of its own (join it to wait for the
    last one): a stream that is still arriving while a test kills, restarts or rebalances."""
    sender = threading.Thread(target=produce, args=(bootstrap, topic, messages), kwargs={"paced": True, "rate": rate})
    sender.start()
    return sender


def produce_in_transactions(bootstrap: str, topic: str, committed: list[tuple[bytes, bytes]],
                            aborted: list[tuple[bytes, bytes]]) -> int:
    """kafka-python's transactional producer: `committed` in transactions of 25, and an aborted
    transaction of `aborted` messages (as many as there are) after every second one; returns how
    many were aborted."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    junk = iter(aborted)
    aborted_count = 0
    for serial, start in enumerate(range(0, len(committed), 25)):
        producer.begin_transaction()
        for key, value in committed[start:start + 25]:
            producer.send(topic, key=key, value=value)
        producer.commit_transaction()
        batch = [message for _, message in zip(range(25), junk, strict=False)] if serial % 2 else []
        if batch:
            producer.begin_transaction()
            for key, value in batch:
                producer.send(topic, key=key, value=value)
            # Written to the log before the abort (unsent records would just be dropped).
            producer.flush()
            producer.abort_transaction()
            aborted_count += len(batch)
    producer.close()
    return aborted_count
