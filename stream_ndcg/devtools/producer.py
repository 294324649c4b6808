"""Sends (key, value) messages to a topic with kafka-python, optionally paced in wall time."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

# kafka-python waits 30 s for a first broker by default; a person running `simulate` against
# the wrong address should hear it sooner.
BOOTSTRAP_TIMEOUT_MS = 8_000


class BrokerUnreachable(Exception):
    """No broker answered at the bootstrap addresses within BOOTSTRAP_TIMEOUT_MS."""


def produce(bootstrap_servers: str, topic: str, messages: Iterable[tuple[bytes | None, bytes | None]], *,
            paced: bool = False, rate: float = 1000.0, **options: Any) -> int:
    """Send (key, value) messages to a topic; with `paced`, at `rate` per second of wall time.

    `options` go to KafkaProducer: the security settings of `Settings.kafka_client_options`,
    a compression type, ...
    """
    options.setdefault("bootstrap_timeout_ms", BOOTSTRAP_TIMEOUT_MS)
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap_servers.split(","), linger_ms=20, acks="all", **options)
    except KafkaError as exc:
        raise BrokerUnreachable(
            f"no Kafka broker answered at {bootstrap_servers} within {options['bootstrap_timeout_ms'] / 1000:g} s "
            f"({type(exc).__name__}: {exc}); check --bootstrap-servers and the security settings") from exc
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
