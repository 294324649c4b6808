"""The dead-letter topic: rejected messages, byte for byte, with the reason in their headers."""

from __future__ import annotations

import logging
from collections.abc import Callable

from stream_ndcg.source.base import Record
from stream_ndcg.source.kafka_output import KafkaOutput, ProducerFactory

logger = logging.getLogger(__name__)


class DeadLetters:
    """Writes rejected messages, byte for byte, to a dead-letter topic with the reason in headers.

    A tombstone without a key goes out as an empty value with ``stream_ndcg.null_value: 1`` (Kafka
    takes no record with neither); one too large for the producer is dropped, logged and counted.
    """

    def __init__(self, connect: ProducerFactory, topic: str, on_dropped: Callable[[], None] = lambda: None) -> None:
        self.output = KafkaOutput(connect, f"dead-letter topic {topic}")
        self.topic = topic
        self.on_dropped = on_dropped

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

        def dropped() -> None:
            self.on_dropped()
            logger.warning("dead letter from %s:%s@%s too large for the producer; dropped",
                           record.topic, record.partition, record.offset)

        self.output.send(self.topic, record.key, value, headers=headers, on_too_large=dropped)

    def flush(self) -> None:
        """Wait until every dead letter of the batch is acknowledged; BrokerUnavailable if one is not."""
        self.output.flush()
