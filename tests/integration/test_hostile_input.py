"""Hostile input through the real broker: each kind rejected with its reason, sent to the
dead-letter topic with its origin, and the numbers of the valid events untouched."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from tests.support.events import BAD, IMPRESSION, encode
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay, replay_of
from tests.support.service import Service, wait_for_messages
from tests.support.topics import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

LIMIT = 100_000


def hostile() -> list[tuple[str, bytes | None, bytes | None, str]]:
    """(name, key, value, reason): the parser's table, plus what only the service checks."""
    cases: list[tuple[str, bytes | None, bytes | None, str]] = []
    for name, raw, reason in BAD:
        if reason == "message_too_large":
            raw = encode(IMPRESSION | {"pad": "x" * (LIMIT + 10)})  # over our limit, under Kafka's
        value = raw if isinstance(raw, bytes) or raw is None else raw.encode()
        cases.append((name, b"bad", value, reason))
    cases.append(("no key", None, encode(IMPRESSION | {"impression_id": "keyless"}), "missing_key"))
    cases.append(("ts far in the future", b"q", encode(IMPRESSION | {"ts": int(time.time() * 1000) + 40 * 86_400_000}),
                  "ts_in_future"))
    return cases


def test_every_kind_of_bad_message_is_rejected_dead_lettered_and_harmless(
        kafka: KafkaBroker, service_env: dict[str, str], services: list[Service], tmp_path: Path) -> None:
    cases = hostile()
    assert len(cases) >= 30
    topic = create_topic(kafka.bootstrap, partitions=2)
    dead_letters = create_topic(kafka.bootstrap, partitions=1)
    valid = list(Simulator(SimulationSpec(events=3000, seed=17, queries=100, rate=100.0)).messages())
    stream: list[tuple[bytes | None, bytes | None]] = []
    # One bad message in every `step` valid ones, each case once.
    step = len(valid) // (len(cases) + 1)
    for i, message in enumerate(valid):
        stream.append(message)
        if i % step == step // 2 and i // step < len(cases):
            _, bad_key, bad_value, _ = cases[i // step]
            stream.append((bad_key, bad_value))
    assert sum(1 for m in stream if m not in valid) == len(cases)
    produce(kafka.bootstrap, topic, stream, max_request_size=4 * LIMIT)
    service = Service(dict(service_env, STREAM_NDCG_TOPICS=topic, STREAM_NDCG_WINDOWS="1d",
                           STREAM_NDCG_DEAD_LETTER_TOPIC=dead_letters,
                           STREAM_NDCG_MAX_MESSAGE_BYTES=str(LIMIT)), tmp_path)
    services.append(service)
    service.start()
    samples = wait_for_messages(service, len(stream))

    # Every gauge of both variants equals the replay of the valid events alone.
    assert expect_equal_to_replay(samples, replay_of(valid), "1d", CUTOFFS) == compared_gauges()
    expected_reasons = Counter(reason for *_, reason in cases)
    for reason, count in expected_reasons.items():
        assert samples[("stream_ndcg_events_rejected_total", (("reason", reason),))] == count, reason
    rejected = sum(v for (name, _), v in samples.items() if name == "stream_ndcg_events_rejected_total")
    assert rejected == len(cases)

    reader = KafkaConsumer(dead_letters, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest",
                           consumer_timeout_ms=10_000)
    letters = list(reader)
    reader.close()
    assert len(letters) == len(cases)
    by_value = {(r.key, r.value): dict(r.headers) for r in letters}
    for name, bad_key, bad_value, reason in cases:
        headers = by_value[(bad_key, bad_value)]
        assert headers["stream_ndcg.reason"].decode() == reason, name
        assert headers["stream_ndcg.topic"].decode() == topic
        assert int(headers["stream_ndcg.partition"]) in (0, 1)
        assert int(headers["stream_ndcg.offset"]) >= 0
    assert "Traceback" not in service.logs()
    assert service.stop() == 0
