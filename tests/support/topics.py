"""A Kafka topic of its own for each test, and traffic sent to it while the test goes on."""

from __future__ import annotations

import threading
import time
import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from stream_ndcg.devtools.producer import produce


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    """A new topic, returned once every partition has a leader (consumers then see all of them)."""
    name = f"events-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = admin.describe_topics([name])
            leaders = [p.get("leader_id", -1) for p in described[0].get("partitions", [])] if described else []
            if len(leaders) == partitions and all(leader >= 0 for leader in leaders):
                return name
            time.sleep(0.2)
    finally:
        admin.close()
    raise AssertionError(f"topic {name} has no leader for all {partitions} partitions after 30s")


def send_paced(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float) -> threading.Thread:
    """Start sending `messages` at `rate` per second in a thread of its own (join it to wait for the
    last one): a stream that is still arriving while a test kills, restarts or rebalances."""
    sender = threading.Thread(target=produce, args=(bootstrap, topic, messages), kwargs={"paced": True, "rate": rate})
    sender.start()
    return sender
