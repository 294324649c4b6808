"""A Kafka topic of its own for each test."""

from __future__ import annotations

import time
import uuid

from kafka import KafkaAdminClient
from kafka.admin import NewTopic


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
