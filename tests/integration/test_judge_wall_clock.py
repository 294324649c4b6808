"""`stream-ndcg judge` on the wall clock (`clock = wall`) against a real Kafka broker and a real
Redis, with two-second boundaries on a stream stamped with the machine's time as it is sent, and a
kill -9 of `judge` mid-stream. Under the wall clock the grades depend on when each boundary closed,
so no replay of the events alone reproduces them; what must hold is that the judge publishes
exactly what it decided and recorded: every judgment its stored state counts, once per event id,
none lost and none added, each pair's last one as its stored grade, every boundary decided in order
after the wall passed it (and on, with no event coming); and that `run` reading the topic, judgments
and republished duplicates included, equals the batch replay of the same records."""

from __future__ import annotations

import re
import threading
import time
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from stream_ndcg import wiring
from stream_ndcg.click_models import Grading, score_of_evidence
from stream_ndcg.config import Settings
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.metric import Measure
from stream_ndcg.offline.replay import Replay
from tests.integration.test_judge import clicks_in_time_order
from tests.support.replay import CUTOFFS, compared_gauges, expect_equal_to_replay
from tests.support.service import Service, own_sample, service_environment, wait_for_messages
from tests.support.topics import create_topic
from tests.support.wait import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

INTERVAL_MS = 2000
MIN_IMPRESSIONS = 3
WALL_SETTINGS = {"clock": "wall", "judge_interval": "2s", "click_bucket": "2s", "click_horizon": "30s",
                 "click_session": "1s", "click_min_impressions": str(MIN_IMPRESSIONS), "click_max_rank": "10"}
BOUNDARY_GAUGE = ("stream_ndcg_judge_boundary_timestamp_seconds", ())


def send_now(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float) -> threading.Thread:
    """Send the messages at `rate` per second in a thread of their own, each with `ts` = the
    machine's time as it goes out: a live stream."""
    def stamped() -> Any:
        for key, value in messages:
            yield key, orjson.dumps({**orjson.loads(value), "ts": int(time.time() * 1000)})

    sender = threading.Thread(target=produce, args=(bootstrap, topic, stamped()), kwargs={"paced": True, "rate": rate})
    sender.start()
    return sender


def read_topic(bootstrap: str, topic: str, partitions: int) -> list[ConsumerRecord]:
    """Every record of the topic, by partition and offset."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed")
    assigned = [TopicPartition(topic, n) for n in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    ends = consumer.end_offsets(assigned)
    found: dict[int, list[ConsumerRecord]] = {n: [] for n in range(partitions)}
    try:
        def read() -> bool:
            for part, records in consumer.poll(timeout_ms=500).items():
                found[part.partition].extend(records)
            return all(consumer.position(tp) >= ends[tp] for tp in assigned)

        wait_until(read, 60, lambda: f"the whole of {topic} read ({sum(map(len, found.values()))} records so far)")
    finally:
        consumer.close()
    return [record for n in range(partitions) for record in found[n]]


def first_copies(records: list[ConsumerRecord]) -> list[tuple[ConsumerRecord, dict[str, Any]]]:
    """Each judgment once (the first copy of its event id and pair, in partition order), after
    checking that every copy of an event id and pair has the same content."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    first = []
    for record in records:
        message = orjson.loads(record.value)
        if message["type"] != "judgment":
            continue
        key = (message["event_id"], message["query_id"], message["doc_id"])
        if key not in seen:
            first.append((record, message))
        assert seen.setdefault(key, message) == message, "one event id published with two contents"
    return first


def assert_graded_by_its_evidence(message: dict[str, Any]) -> None:
    """A judgment's grade is its evidence's, as anyone would read it (but for a score within a
    rounding of a threshold: the evidence's expected clicks are a float)."""
    evidence = message["evidence"]
    if evidence["impressions"] < MIN_IMPRESSIONS:
        assert message["grade"] is None, message
        return
    score = score_of_evidence(evidence)
    if any(abs(score - float(bound)) < 1e-9 for bound in Grading("coec").bounds()):
        return
    assert message["grade"] == Grading("coec").to_grade(Fraction(score)), message


def test_judge_on_the_wall_clock_killed_mid_stream_publishes_what_it_decided(
        kafka: KafkaBroker, redis_server: Any, services: list[Service], tmp_path: Path) -> None:
    partitions = 3
    topic = create_topic(kafka.bootstrap, partitions=partitions)
    env = service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                              STREAM_NDCG_JUDGE_GROUP_ID=f"judge-{uuid.uuid4().hex[:8]}", STREAM_NDCG_BATCH_SIZE="100",
                              **{f"STREAM_NDCG_{name.upper()}": value for name, value in WALL_SETTINGS.items()})
    judge = Service(env, tmp_path, command="judge")
    services.append(judge)
    judge.start()
    # About 26 s of searches and clicks: longer than the restart takes (the group waits out the killed
    # member's session), so that the judge takes part of the stream in live after it.
    messages = clicks_in_time_order(6_000, seed=23)
    sender = send_now(kafka.bootstrap, topic, messages, 100.0)
    wait_until(lambda: own_sample(judge, "stream_ndcg_judgments_published_total") >= 20, 60,
               lambda: f"judge publishing\n{judge.logs()[-3000:]}", interval=0.05)
    assert sender.is_alive(), "the kill should land mid-stream"
    judge.kill()
    judge.start()
    sender.join()
    sent_until_ms = time.time() * 1000
    wait_until(lambda: re.search(r"resuming at offset \d+", judge.logs()), 60,
               lambda: f"judge resuming mid-stream\n{judge.logs()[-3000:]}")
    # No event comes any more: the wall alone takes the boundaries on.
    wait_until(lambda: judge.scrape().get(BOUNDARY_GAUGE, 0) * 1000 >= sent_until_ms + 2 * INTERVAL_MS, 60,
               lambda: f"boundaries decided past the stream's end\n{judge.logs()[-3000:]}", interval=0.2)
    assert judge.stop() == 0

    records = read_topic(kafka.bootstrap, topic, partitions)
    judgments = first_copies(records)
    events = [orjson.loads(r.value) for r in records if orjson.loads(r.value)["type"] != "judgment"]
    assert len(events) == len(messages)

    # What the judge recorded: per partition, the judgments it decided (all published: no outbox
    # left), its last boundary and its clock.
    store = wiring.judge_store(Settings.load(environ=env))
    figures = store.figures()
    assert len(figures) == partitions
    assert all(not store.load(name).outbox for name in figures)
    assert len(judgments) == sum(int(meta["emitted"]) for meta in figures.values()) > 100
    last_event_ms = max(event["ts"] for event in events)
    for meta in figures.values():
        clock, closed = int(meta["clock"]), int(meta["closed"])
        # Decided up to the wall's last boundary, or waiting at the next one.
        assert closed - clock // INTERVAL_MS * INTERVAL_MS in (0, INTERVAL_MS) and closed >= last_event_ms + INTERVAL_MS

    # Each judgment decided at a boundary, published once the wall had passed it, each partition's in
    # boundary order; each pair's judgments are changes of its grade, the last one its stored grade.
    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for n in range(partitions):
        boundaries = [message["ts"] for record, message in judgments if record.partition == n]
        assert boundaries == sorted(boundaries)
    for record, message in judgments:
        assert message["ts"] % INTERVAL_MS == 0 and message["event_id"] == f"coec@{message['ts']}"
        assert record.timestamp >= message["ts"], "a boundary's judgment published before the wall passed it"
        assert_graded_by_its_evidence(message)
        by_pair.setdefault((message["query_id"], message["doc_id"]), []).append(message)
    assert len({message["ts"] for _, message in judgments}) >= 4
    for pair_judgments in by_pair.values():
        grades = [message["grade"] for message in pair_judgments]
        assert grades[0] is not None and all(a != b for a, b in zip(grades, grades[1:], strict=False))
    graded = {pair: (given.grade, given.ts, given.evidence) for name in figures
              for pair, given in store.graded(name).items()}
    last = {pair: found[-1] for pair, found in by_pair.items()}
    assert graded == {pair: (m["grade"], m["ts"], m["evidence"]) for pair, m in last.items() if m["grade"] is not None}

    # run on the topic as it is, judgments and their republished copies included, equals the replay.
    run = Service(service_environment(kafka.bootstrap, redis_server.url, STREAM_NDCG_TOPICS=topic,
                                      STREAM_NDCG_WINDOWS="1d", STREAM_NDCG_K="5,10"), tmp_path)
    services.append(run)
    run.start()
    samples = wait_for_messages(run, len(records))
    replay = Replay(Measure(cutoffs=CUTOFFS), dedup_horizon_ms=Settings().dedup_horizon)
    for record in records:
        replay.add(record.value)
    summary = replay.summary()
    assert any(by_k["5"]["judged_ratio"] for by_k in summary["by_segment"]["variant"].values())
    assert expect_equal_to_replay(samples, summary, "1d", CUTOFFS) == compared_gauges()
    assert run.stop() == 0
