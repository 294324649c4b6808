"""DeadLetters' own rules, and those of the `KafkaOutput` it writes with (as `judge`'s judgments
and `ubi-bridge`'s output do), on a stand-in producer (the real broker path is in
test_hostile_input, test_judge and test_ubi_bridge)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
import pytest
from kafka.errors import KafkaConnectionError, MessageSizeTooLargeError, UnknownError

from stream_ndcg.dead_letters import DeadLetters
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.judge_service import KafkaPublisher
from stream_ndcg.source.base import Partition
from stream_ndcg.source.kafka_output import KafkaOutput


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
    exception: Exception | None = None

    def succeeded(self) -> bool:
        return self.ok


@dataclass
class Producer:
    """Records what it is asked to send; refuses what a real producer would."""

    sent: list[dict[str, Any]] = field(default_factory=list)
    acknowledge: bool = True
    max_size: int = 100
    # Larger values the broker refuses, after which every later record fails the same way (as
    # kafka-python's idempotent producer does once a non-retriable error made it fatal).
    broker_max_size: int = 100
    fatal: Exception | None = None
    # Flushes that end early, as kafka-python's does while it splits a batch refused for its size.
    unfinished_flushes: int = 0

    def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
             headers: list[tuple[str, bytes]] | None) -> Future:
        if key is None and value is None:
            raise ValueError("Need at least one: key or value")
        if len(value or b"") > self.max_size:
            raise MessageSizeTooLargeError("too large")
        if len(value or b"") > self.broker_max_size:
            self.fatal = self.fatal or MessageSizeTooLargeError("MESSAGE_SIZE_TOO_LARGE")
        if self.fatal is not None:
            return Future(False, self.fatal)
        self.sent.append({"topic": topic, "key": key, "value": value, "headers": dict(headers or [])})
        return Future(self.acknowledge, None if self.acknowledge else KafkaConnectionError("no ack"))

    def flush(self, timeout: float) -> None:
        if self.unfinished_flushes:
            self.unfinished_flushes -= 1
            raise UnknownError("Future not done")

    def close(self, timeout: float) -> None:
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


def test_a_record_the_broker_refuses_for_its_size_is_told_from_those_it_took_down_with_it() -> None:
    producers: list[Producer] = []

    def connect() -> Producer:
        producers.append(Producer(max_size=10_000, broker_max_size=100, unfinished_flushes=2))
        return producers[-1]

    refused: list[bytes] = []
    output = KafkaOutput(connect, "output topic")
    for value in (b"a", b"x" * 500, b"b", b"y" * 600, b"c"):
        output.send("out", b"q", value, on_too_large=partial(refused.append, value[:1]))
    output.flush()
    assert refused == [b"x", b"y"]
    assert [sent["value"] for producer in producers for sent in producer.sent] == [b"a", b"b", b"c"]
    # Each refusal closed the producer it made fatal; the next records go on a new one.
    assert len(producers) == 4
    output.send("out", b"q", b"d")
    output.flush()
    assert producers[-1].sent[-1]["value"] == b"d"


def test_a_refusal_for_size_without_a_handler_or_with_other_failures_is_an_outage() -> None:
    producers: list[Producer] = []

    def connect() -> Producer:
        producers.append(Producer(max_size=10_000, broker_max_size=100))
        return producers[-1]

    output = KafkaOutput(connect, "judgments")
    output.send("out", b"q", b"x" * 500)
    with pytest.raises(BrokerUnavailable, match="1 record"):
        output.flush()
    # The producer the refusal made fatal is not used again.
    output.send("out", b"q", b"a")
    output.flush()
    assert len(producers) == 2 and producers[1].sent[0]["value"] == b"a"
    flaky = Producer(acknowledge=False)
    output = KafkaOutput(lambda: flaky, "output topic")
    output.send("out", b"q", b"a", on_too_large=lambda: None)
    with pytest.raises(BrokerUnavailable, match="not acknowledged"):
        output.flush()


def test_judge_drops_and_counts_a_judgment_the_broker_refuses_for_its_size() -> None:
    producers: list[Producer] = []

    def connect() -> Producer:
        producers.append(Producer(max_size=10_000, broker_max_size=300))
        return producers[-1]

    dropped: list[int] = []
    publisher = KafkaPublisher(KafkaOutput(connect, "judgments"), lambda: dropped.append(1))
    judgments = [orjson.dumps({"type": "judgment", "query_id": query, "doc_id": "d1", "grade": 1.0, "ts": 1,
                               "event_id": "coec@1"}) for query in ("q1", "q" * 400, "q2")]
    publisher.publish(Partition("events", 2), judgments)
    assert dropped == [1]
    assert [sent["value"] for producer in producers for sent in producer.sent] == [judgments[0], judgments[2]]
