"""`KafkaOutput`: what the services write (dead letters, `judge`'s judgments, `ubi-bridge`'s
output), through one kafka-python producer, with that producer's workarounds in one place.

kafka-python 3.0's idempotent producer treats a batch the broker refuses for its size (larger than
the topic's `max.message.bytes`, once a batch of several records was split) as a fatal error: every
later batch fails with the same error until the producer is closed, so the record refused cannot be
told from those that merely followed it (seen in tests/integration/test_ubi_bridge.py; no upstream
issue found). `flush` sends the refused records again, each alone on a new producer. And the split
of such a batch makes kafka-python's own `flush` raise before it is done (see `KafkaOutput._wait`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError, UnknownError

from stream_ndcg.errors import BrokerUnavailable

ProducerFactory = Callable[[], KafkaProducer]
# Each split halves a batch, so a batch of a few hundred records is down to single records long before.
_SPLITS = 32


class KafkaOutput:
    """A kafka-python producer made on first use, whose sends are waited for together.

    The producer is made at the first send, inside the caller's backoff (the brokers may be down
    when the service starts); every Kafka error becomes `BrokerUnavailable`, naming `name` (what the
    records are), and `flush` waits for everything sent since the last flush and fails unless each
    record was acknowledged. A record sent with `on_too_large` that is refused for its size (by the
    producer at `send`, by the broker at `flush`) calls it instead and is not written. The dead
    letters, `judge`'s judgments and `ubi-bridge`'s output use it.

        output = KafkaOutput(lambda: KafkaProducer(acks="all"), "judgments")
        output.send("search-events", b"q1", b'{"type": "judgment", ...}', partition=0)
        output.flush()
    """

    def __init__(self, connect: ProducerFactory, name: str) -> None:
        self._connect = connect
        self._producer: KafkaProducer | None = None
        self._pending: list[tuple[_Outgoing, Any]] = []
        self.name = name

    @property
    def producer(self) -> KafkaProducer:
        if self._producer is None:
            try:
                self._producer = self._connect()
            except KafkaError as exc:
                raise BrokerUnavailable(f"{self.name}: producer cannot connect: {type(exc).__name__}") from exc
        return self._producer

    def send(self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None, on_too_large: Callable[[], None] | None = None) -> None:
        """Send one record; one refused for its size calls `on_too_large` and is not written, or
        without it is a `BrokerUnavailable` as any other refusal."""
        outgoing = _Outgoing(topic, key, value, partition, headers, on_too_large)
        future = self._send(outgoing)
        if future is not None:
            self._pending.append((outgoing, future))

    def flush(self) -> None:
        """Wait until every record sent since the last flush is acknowledged; BrokerUnavailable if one is not.

        The records the broker refused, if one of them has `on_too_large` and was refused for its size,
        are sent again one at a time, each on a new producer: once a batch fails so, kafka-python 3.0's
        idempotent producer fails every later one with the same error (a non-retriable error is fatal
        to it: `TransactionManager.classify_batch_error`), so only a record refused alone is too large.
        """
        pending, self._pending = self._pending, []
        self._wait()
        failed = [(outgoing, future) for outgoing, future in pending if not future.succeeded()]
        if not failed:
            return
        # The producer may be fatal now (see above): what comes next goes on a new one.
        self.close()
        if not any(outgoing.on_too_large is not None and _too_large(future) for outgoing, future in failed):
            raise BrokerUnavailable(f"{self.name}: {len(failed)} record(s) not acknowledged")
        for outgoing, _ in failed:
            future = self._send(outgoing)
            self._wait()
            if future is None or future.succeeded():
                continue
            self.close()
            if outgoing.on_too_large is None or not _too_large(future):
                raise BrokerUnavailable(f"{self.name}: a record not acknowledged: {future.exception!r}")
            outgoing.on_too_large()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None

    def _send(self, outgoing: _Outgoing) -> Any:
        """The future of the record sent, or None if the producer refused it for its size at once."""
        try:
            return self.producer.send(outgoing.topic, key=outgoing.key, value=outgoing.value,
                                      partition=outgoing.partition, headers=outgoing.headers)
        except MessageSizeTooLargeError:
            if outgoing.on_too_large is None:
                raise BrokerUnavailable(f"{self.name}: a record too large for the producer") from None
            outgoing.on_too_large()
            return None
        except KafkaError as exc:
            raise BrokerUnavailable(f"{self.name}: Kafka unreachable: {type(exc).__name__}: {exc}") from exc

    def _wait(self) -> None:
        """Wait for every record sent; kafka-python 3.0.12's `flush` raises UnknownError("Future not
        done") when a batch refused for its size was split meanwhile (it waited for the batch split,
        not for its halves; the Java client had the same fault, KAFKA-9312), so it is called again."""
        if self._producer is None:
            return
        for _ in range(_SPLITS):
            try:
                self._producer.flush(timeout=30)
                return
            except UnknownError as exc:
                if "Future not done" not in str(exc):
                    raise BrokerUnavailable(f"{self.name}: Kafka unreachable: {type(exc).__name__}: {exc}") from exc
            except KafkaError as exc:
                raise BrokerUnavailable(f"{self.name}: Kafka unreachable: {type(exc).__name__}: {exc}") from exc
        raise BrokerUnavailable(f"{self.name}: records still not acknowledged after {_SPLITS} flushes")


@dataclass(frozen=True)
class _Outgoing:
    """A record sent, kept until it is acknowledged (to be sent again alone if it was refused)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: list[tuple[str, bytes]] | None
    on_too_large: Callable[[], None] | None


def _too_large(future: Any) -> bool:
    """Whether a record's send failed for its size: the batch holding it was larger than the topic's
    `max.message.bytes` (kafka-python splits a batch of several records first) or a segment."""
    return isinstance(future.exception, (MessageSizeTooLargeError, RecordListTooLargeError))
