"""`judge`'s loop on an in-memory source and store: over several partitions, and when its instance
is replaced mid-stream, it publishes what one judge reading the whole stream in time order decides
(judgments deduplicated by event id and pair, as `run` deduplicates them)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from stream_ndcg.click_judge import ClickJudge, JudgeSettings
from stream_ndcg.click_models import Grading
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.exporter import Exporter
from stream_ndcg.judge_loop import JudgeOptions, JudgeProcessor
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.pipeline import RecordChecks
from stream_ndcg.source.base import Partition
from stream_ndcg.source.local import LocalSource
from stream_ndcg.state.judge_store import MemoryJudgeStore

TOPIC = "events"
MINUTE = 60_000
SETTINGS = JudgeSettings(Grading("coec", min_impressions=3), horizon_ms=60 * MINUTE, bucket_ms=10 * MINUTE,
                         max_rank=10, session_ms=2 * MINUTE, interval_ms=10 * MINUTE, dedup_ms=10 * MINUTE)


class ListPublisher:
    """Keeps what is published, and checks that each judgment goes to its query's partition."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.sent: list[dict[str, Any]] = []

    def publish(self, partition: Partition, messages: Sequence[bytes]) -> None:
        for message in map(orjson.loads, messages):
            assert partition == Partition(TOPIC, zlib.crc32(message["query_id"].encode()) % self.partitions)
            self.sent.append(message)

    def close(self) -> None:
        return None


def clicks_in_time_order(events: int = 1500, seed: int = 5) -> list[tuple[bytes, bytes]]:
    spec = SimulationSpec(events=events, seed=seed, queries=30, rate=0.3, clicks=True)
    messages = [(k, v) for k, v in Simulator(spec).messages() if b'"judgment"' not in v]
    return sorted(messages, key=lambda kv: orjson.loads(kv[1])["ts"])


def expected(messages: list[tuple[bytes, bytes]], grading: Grading) -> list[dict[str, Any]]:
    judge = ClickJudge(JudgeSettings(grading, **{k: getattr(SETTINGS, k) for k in (
        "horizon_ms", "bucket_ms", "max_rank", "session_ms", "interval_ms", "dedup_ms")}))
    found: list[dict[str, Any]] = []
    for _, value in messages:
        event = parse_event(value)
        if isinstance(event, Impression | Click):
            found.extend(j.message() for j in judge.add(event))
    return found


def processor(source: LocalSource, store: MemoryJudgeStore, publisher: ListPublisher,
              grading: Grading) -> JudgeProcessor:
    settings = JudgeSettings(grading, **{k: getattr(SETTINGS, k) for k in (
        "horizon_ms", "bucket_ms", "max_rank", "session_ms", "interval_ms", "dedup_ms")})
    exporter = Exporter(CollectorRegistry(), None, None, judge=JudgeCollector(store, "test", grading.model))
    made = JudgeProcessor(source, store, publisher, exporter,
                          JudgeOptions((TOPIC,), linger_ms=0, batch_size=200, start_from="earliest", idle_ms=0,
                                       checks=RecordChecks(require_key=True)), settings)
    made.IDLE_CHECK_S = 0.0
    assert made.start()
    return made


def fill(source: LocalSource, messages: list[tuple[bytes, bytes]], partitions: int) -> None:
    for key, value in messages:
        source.append(TOPIC, zlib.crc32(key) % partitions, key=key, value=value)


def deduplicated(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for message in sent:
        key = (message["event_id"], message["query_id"], message["doc_id"])
        assert seen.setdefault(key, message) == message, "an event id published with two different contents"
    return sorted(seen.values(), key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))


def run_until_quiet(made: JudgeProcessor, publisher: ListPublisher, rounds: int = 2000) -> None:
    quiet = 0
    for _ in range(rounds):
        before = (len(publisher.sent), sum(c.offset or 0 for _, c in made.ownership.owned()))
        made.run_once()
        after = (len(publisher.sent), sum(c.offset or 0 for _, c in made.ownership.owned()))
        quiet = quiet + 1 if after == before else 0
        if quiet > 20:
            return


def test_several_partitions_publish_what_one_judge_of_the_whole_stream_decides() -> None:
    messages = clicks_in_time_order()
    for grading in (Grading("coec", min_impressions=3), Grading("sdbn", min_impressions=3)):
        source, store, publisher = LocalSource({TOPIC: 3}), MemoryJudgeStore(), ListPublisher(3)
        fill(source, messages, 3)
        run_until_quiet(processor(source, store, publisher, grading), publisher)
        want = expected(messages, grading)
        assert len(want) > 50
        assert deduplicated(publisher.sent) == sorted(want, key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))


def test_an_instance_replaced_mid_stream_publishes_the_same_judgments() -> None:
    messages = clicks_in_time_order(seed=6)
    grading = Grading("coec", min_impressions=3)
    source, store, publisher = LocalSource({TOPIC: 4}), MemoryJudgeStore(), ListPublisher(4)
    fill(source, messages, 4)
    first = processor(source, store, publisher, grading)
    for _ in range(15):
        first.run_once()
    # Its memory is lost: the next instance goes on from the store's state, offsets and outbox.
    second = processor(source, store, publisher, grading)
    run_until_quiet(second, publisher)
    want = sorted(expected(messages, grading), key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))
    assert deduplicated(publisher.sent) == want
    assert store.figures()


def test_two_instances_sharing_the_partitions_publish_what_one_judge_decides() -> None:
    """The boundaries are decided across instances, through the store: each instance holds two of
    four partitions and sums the rank counts the other's partitions closed the boundary with."""
    messages = clicks_in_time_order(seed=7)
    grading = Grading("coec", min_impressions=3)
    store, publisher = MemoryJudgeStore(), ListPublisher(4)
    instances = []
    for held in ((0, 2), (1, 3)):
        source = LocalSource({TOPIC: 4})
        fill(source, messages, 4)
        source.assign([Partition(TOPIC, n) for n in held])
        instances.append(processor(source, store, publisher, grading))
    quiet = 0
    while quiet < 20:
        before = len(publisher.sent), sorted(store.figures().items())
        for made in instances:
            made.run_once()
        quiet = quiet + 1 if (len(publisher.sent), sorted(store.figures().items())) == before else 0
    want = sorted(expected(messages, grading), key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))
    assert deduplicated(publisher.sent) == want


def test_records_deleted_before_they_were_read_are_skipped_and_counted() -> None:
    messages = clicks_in_time_order(seed=8)
    grading = Grading("coec", min_impressions=3)
    source, store, publisher = LocalSource({TOPIC: 1}), MemoryJudgeStore(), ListPublisher(1)
    fill(source, messages[:100], 1)
    first = processor(source, store, publisher, grading)
    run_until_quiet(first, publisher)
    fill(source, messages[100:], 1)
    source.delete_records(TOPIC, 0, 150)
    second = processor(source, store, publisher, grading)
    run_until_quiet(second, publisher)
    assert second.exporter.registry.get_sample_value("stream_ndcg_offsets_skipped_total",
                                                     {"topic": TOPIC, "partition": "0"}) == 50
    assert store.load(f"{TOPIC}:0").offset == len(messages)
