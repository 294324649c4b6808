"""DeadLetters' own rules, and those of the `KafkaOutput` it writes with (as `judge`'s judgments
and `ubi-bridge`'s output do), on a stand-in producer (the real broker path is in
test_hostile_input, test_judge and test_ubi_bridge)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from stream_ndcg.dead_letters import DeadLetters
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.source.kafka import KafkaOutput


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    topic: str = "in"
    partition: int = 3
    offset: int = 42


@dataclass
class Future:
    ok: bool

    def succeeded(self) -> bool:
        return self.ok


@dataclass
class Producer:
    """Records what it is asked to send; refuses what a real producer would."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    acknowledge: bool = True
    max_size: int = 100

    def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
             headers: list[tuple[str, bytes]] | None) -> Future:
        if key is None and value is None:
            raise ValueError("Need at least one: key or value")
        if len(value or b"") > self.max_size:
            raise MessageSizeTooLargeError("too large")
        self.sent.append({"topic": topic, "key": key, "value": value, "headers": dict(headers or [])})
        return Future(self.acknowledge)

    def flush(self, timeout: float) -> None:
        pass


def test_origin_and_reason_travel_in_headers() -> None:
    producer = Producer()
    letters = DeadLetters(lambda: producer, "dlq")
    letters.send(Record(b"q", b"{oops"), "not_json")
    letters.flush()
    [sent] = producer.sent
    assert sent["topic"] == "dlq" and sent["key"] == b"q" and sent["value"] == b"{oops"
    assert sent["headers"] == {"stream_ndcg.reason": b"not_json", "stream_ndcg.topic": b"in",
                               "stream_ndcg.partition": b"3", "stream_ndcg.offset": b"42"}


def test_a_keyless_tombstone_goes_out_as_an_empty_marked_value() -> None:
    producer = Producer()
    letters = DeadLetters(lambda: producer, "dlq")
    letters.send(Record(None, None), "null_message")
    [sent] = producer.sent
    assert sent["value"] == b"" and sent["headers"]["stream_ndcg.null_value"] == b"1"


def test_too_large_is_dropped_and_counted_and_unacknowledged_is_an_outage() -> None:
    dropped: list[int] = []
    producer = Producer(acknowledge=False)
    letters = DeadLetters(lambda: producer, "dlq", lambda: dropped.append(1))
    letters.send(Record(b"q", b"x" * 1000), "message_too_large")
    assert dropped == [1] and not producer.sent
    letters.send(Record(b"q", b"x"), "not_json")
    with pytest.raises(BrokerUnavailable, match="not acknowledged"):
        letters.flush()


def test_the_output_connects_on_first_send_and_maps_every_refusal_to_an_outage() -> None:
    connects: list[int] = []
    producer = Producer()

    def connect() -> Producer:
        connects.append(1)
        if len(connects) == 1:
            raise KafkaConnectionError("no broker")
        return producer

    output = KafkaOutput(connect, "judgments")
    output.flush()
    assert connects == []
    with pytest.raises(BrokerUnavailable, match="judgments: producer cannot connect"):
        output.send("events", b"q", b"{}")
    output.send("events", b"q", b"{}", partition=2)
    output.flush()
    assert connects == [1, 1] and producer.sent == [{"topic": "events", "key": b"q", "value": b"{}", "headers": {}}]
    # Without a handler of its own, a record too large is an outage too (retried, never skipped).
    with pytest.raises(BrokerUnavailable, match="too large"):
        output.send("events", b"q", b"x" * 1000)
