"""The dead-letter topic: rejected messages, byte for byte, with the reason in their headers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, MessageSizeTooLargeError

from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.source.base import Record

logger = logging.getLogger(__name__)


class DeadLetters:
    """Writes rejected messages, byte for byte, to a dead-letter topic with the reason in headers.

    A tombstone without a key goes out as an empty value with ``stream_ndcg.null_value: 1`` (Kafka
    takes no record with neither); one too large for the producer is dropped, logged and counted.
    """

    def __init__(self, connect: Callable[[], KafkaProducer], topic: str,
                 on_dropped: Callable[[], None] = lambda: None) -> None:
        self._connect = connect
        self._producer: KafkaProducer | None = None
        self._pending: list[Any] = []
        self.topic = topic
        self.on_dropped = on_dropped

    @property
    def producer(self) -> KafkaProducer:
        # Created on first use, inside the loop's backoff: the brokers may be down at start.
        if self._producer is None:
            try:
                self._producer = self._connect()
            except KafkaError as exc:
                raise BrokerUnavailable(f"dead-letter producer cannot connect: {type(exc).__name__}") from exc
        return self._producer

    def send(self, record: Record, reason: str) -> None:
        headers = [
            ("stream_ndcg.reason", reason.encode()),
            ("stream_ndcg.topic", record.topic.encode()),
            ("stream_ndcg.partition", str(record.partition).encode()),
            ("stream_ndcg.offset", str(record.offset).encode()),
        ]
        value = record.value
        if record.key is None and value is None:
            value = b""
            headers.append(("stream_ndcg.null_value", b"1"))
        try:
            self._pending.append(self.producer.send(self.topic, key=record.key, value=value, headers=headers))
        except MessageSizeTooLargeError:
            self.on_dropped()
            logger.warning("dead letter from %s:%s@%s too large for the producer; dropped",
                           record.topic, record.partition, record.offset)
        except KafkaError as exc:
            raise BrokerUnavailable(f"dead-letter topic {self.topic} unreachable: {exc}") from exc

    def flush(self) -> None:
        """Wait until every dead letter of the batch is acknowledged; BrokerUnavailable if one is not."""
        pending, self._pending = self._pending, []
        try:
            self.producer.flush(timeout=30)
        except KafkaError as exc:
            raise BrokerUnavailable(f"dead-letter topic {self.topic} unreachable: {exc}") from exc
        failed = [future for future in pending if not future.succeeded()]
        if failed:
            raise BrokerUnavailable(f"{len(failed)} dead letter(s) not acknowledged by {self.topic}")
