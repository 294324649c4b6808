"""Sends (key, value) messages to a topic with kafka-python, optionally paced in wall time."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaProducer


def produce(bootstrap_servers: str, topic: str, messages: Iterable[tuple[bytes | None, bytes | None]], *,
            paced: bool = False, rate: float = 1000.0, **options: Any) -> int:
    """Send (key, value) messages to a topic; with `paced`, at `rate` per second of wall time."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers.split(","), linger_ms=20, acks="all", **options)
    started = time.monotonic()
    sent = 0
    try:
        for key, value in messages:
            if paced:
                lag = started + sent / rate - time.monotonic()
                if lag > 0:
                    time.sleep(lag)
            producer.send(topic, key=key, value=value)
            sent += 1
        producer.flush()
    finally:
        producer.close()
    return sent
