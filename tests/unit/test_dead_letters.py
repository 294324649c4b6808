"""DeadLetters' own rules, on a stand-in producer (the real broker path is in test_hostile_input)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.errors import MessageSizeTooLargeError

from stream_ndcg.dead_letters import DeadLetters
from stream_ndcg.errors import BrokerUnavailable


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

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> Future:
        if key is None and value is None:
            raise ValueError("Need at least one: key or value")
        if len(value or b"") > self.max_size:
            raise MessageSizeTooLargeError("too large")
        self.sent.append({"topic": topic, "key": key, "value": value, "headers": dict(headers)})
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
