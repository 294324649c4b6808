"""A Kafka topic of its own for each test, and traffic sent to it while the test goes on."""

from __future__ import annotations

import threading
import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from stream_ndcg.devtools.producer import produce
from tests.support.wait import wait_until


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    """A new topic, returned once every partition has a leader (consumers then see all of them)."""
    name = f"events-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])

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
