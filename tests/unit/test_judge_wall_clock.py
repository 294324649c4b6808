"""`judge`'s loop on the wall clock (`clock = wall`), with the wall time injected: a boundary is
decided once the wall passes it, whatever the events' times; a partition without records does not
hold it back, and its close is committed all the same; a crash between the commit and the publish
republishes the stored judgments unchanged, and a holder fenced out decides nothing; a partition
first claimed after a boundary passes it with nothing (tests/unit/test_judge_boundaries.py has
the partitions that start in one long cycle)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from stream_ndcg.click_judge import ClickJudge
from stream_ndcg.click_models import Grading
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.exporter import Exporter
from stream_ndcg.judge_loop import JudgeOptions, JudgeProcessor
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.pipeline import RecordChecks
from stream_ndcg.source.base import Partition
from stream_ndcg.source.local import LocalSource
from stream_ndcg.state.judge_store import MemoryJudgeStore
from tests.unit.test_judge_loop import (
    SETTINGS,
    TOPIC,
    ListPublisher,
    clicks_in_time_order,
    deduplicated,
    fill,
    run_until_quiet,
)

COEC = Grading("coec", min_impressions=3)
INTERVAL = SETTINGS.interval_ms
MINUTE = 60_000


class Wall:
    """The injected wall clock, in whole seconds (exact as floats)."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms / 1000


class FailingPublisher(ListPublisher):
    """The brokers are gone: nothing it is given is published."""

    def publish(self, partition: Partition, messages: Sequence[bytes]) -> None:
        raise BrokerUnavailable(f"judgments not published to {partition.name}")


def judge_processor(source: LocalSource, store: MemoryJudgeStore, publisher: ListPublisher, wall: Wall, *,
                    wall_clock: bool = True) -> JudgeProcessor:
    exporter = Exporter(CollectorRegistry(), None, None, judge=JudgeCollector(store, "test", COEC.model))
    # judge_idle as good as never: only the wall clock may pass a partition without records.
    options = JudgeOptions((TOPIC,), linger_ms=0, batch_size=200, start_from="earliest", idle_ms=10**9,
                           checks=RecordChecks(require_key=True), wall_clock=wall_clock)
    made = JudgeProcessor(source, store, publisher, exporter, options, SETTINGS, clock=wall)
    made.IDLE_CHECK_S = 0.0
    assert made.start()
    return made


def first_boundary_after(messages: list[tuple[bytes, bytes]]) -> int:
    latest: int = max(orjson.loads(v)["ts"] for _, v in messages)
    return (latest // INTERVAL + 1) * INTERVAL


def only_partition(messages: list[tuple[bytes, bytes]], partition: int, partitions: int) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in messages if zlib.crc32(k) % partitions == partition]


def minutes(messages: list[tuple[bytes, bytes]]) -> list[tuple[int, list[tuple[bytes, bytes]]]]:
    """The events by minute of event time, each with the wall time they arrive at: its minute's end."""
    found: dict[int, list[tuple[bytes, bytes]]] = {}
    for key, value in messages:
        found.setdefault(orjson.loads(value)["ts"] // MINUTE + 1, []).append((key, value))
    return [(minute * MINUTE, group) for minute, group in sorted(found.items())]


def live(made: JudgeProcessor, publisher: ListPublisher, source: LocalSource, wall: Wall,
         messages: list[tuple[bytes, bytes]]) -> None:
    """Stream the events as they happen: each minute's reach Kafka at its end, on the wall."""
    for now_ms, group in minutes(messages):
        wall.now_ms = now_ms
        fill(source, group, 3)
        run_until_quiet(made, publisher)


def decided_live(messages: list[tuple[bytes, bytes]], end_ms: int) -> list[dict[str, Any]]:
    """What one judge decides that takes each minute's events in at its end, then sees the wall
    at `end_ms`."""
    judge = ClickJudge(SETTINGS)
    found = []
    for now_ms, group in minutes(messages):
        found.extend(judge.advance(now_ms))
        for _, value in group:
            event = parse_event(value)
            if isinstance(event, Impression | Click):
                judge.take(event)
    found.extend(judge.advance(end_ms))
    return sorted((j.message() for j in found), key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))


def test_boundaries_are_decided_when_the_wall_time_passes_them() -> None:
    messages = clicks_in_time_order()
    last = first_boundary_after(messages)
    source, store, publisher = LocalSource({TOPIC: 3}), MemoryJudgeStore(), ListPublisher(3)
    wall = Wall(0)
    made = judge_processor(source, store, publisher, wall)
    live(made, publisher, source, wall, messages)
    before = len(publisher.sent)
    # No event passes the last boundary: the wall does.
    wall.now_ms = last + 1000
    run_until_quiet(made, publisher)
    want = decided_live(messages, last + 1000)
    assert len({m["ts"] for m in want}) > 5 and sum(m["grade"] is not None for m in want) > 50
    assert deduplicated(publisher.sent) == want
    assert {m["ts"] for m in publisher.sent[before:]} == {last}
    assert {m["event_id"] for m in publisher.sent} == {f"coec@{m['ts']}" for m in want}


def test_partitions_without_records_do_not_hold_a_boundary_back() -> None:
    messages = only_partition(clicks_in_time_order(seed=9), 0, 3)
    end = first_boundary_after(messages) + 1000
    for wall_clock in (False, True):
        source, store, publisher = LocalSource({TOPIC: 3}), MemoryJudgeStore(), ListPublisher(3)
        wall = Wall(0)
        made = judge_processor(source, store, publisher, wall, wall_clock=wall_clock)
        live(made, publisher, source, wall, messages)
        wall.now_ms = end
        run_until_quiet(made, publisher)
        if not wall_clock:
            # Partitions 1 and 2 never pass the first boundary partition 0's events reach.
            assert publisher.sent == []
            continue
        want = decided_live(messages, end)
        assert len(want) > 20 and deduplicated(publisher.sent) == want
        # The empty partitions' closes were committed with their offsets, as any batch.
        for n in range(3):
            status = store.statuses([f"{TOPIC}:{n}"])[f"{TOPIC}:{n}"]
            assert status.closed == end - 1000 and status.waiting is None
            assert store.load(f"{TOPIC}:{n}").offset == (len(messages) if n == 0 else 0)


def test_a_crash_between_commit_and_publish_republishes_the_same_judgments() -> None:
    messages = clicks_in_time_order(seed=10)
    last = first_boundary_after(messages)
    source, store, publisher = LocalSource({TOPIC: 3}), MemoryJudgeStore(), ListPublisher(3)
    wall = Wall(0)
    first = judge_processor(source, store, publisher, wall)
    live(first, publisher, source, wall, messages)
    # The brokers go away as the wall passes the last boundary: it is decided, and not published.
    first.publisher = FailingPublisher(3)
    wall.now_ms = last + 1000
    for _ in range(5):
        first.run_once()
    stored = sorted((orjson.loads(m) for n in range(3) for m in store.load(f"{TOPIC}:{n}").outbox),
                    key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))
    want = decided_live(messages, last + 1000)
    assert stored and stored == [m for m in want if m["ts"] == last]
    # The next instance, later on the wall but before the next boundary, publishes what was stored.
    wall.now_ms = last + INTERVAL // 2
    before = len(publisher.sent)
    run_until_quiet(judge_processor(source, store, publisher, wall), publisher)
    assert sorted(publisher.sent[before:], key=lambda m: (m["ts"], m["query_id"], m["doc_id"])) == stored
    assert deduplicated(publisher.sent) == want
    assert all(not store.load(f"{TOPIC}:{n}").outbox for n in range(3))


def test_a_holder_fenced_out_before_it_closes_a_boundary_decides_nothing() -> None:
    messages = clicks_in_time_order(seed=11)
    last = first_boundary_after(messages)
    store, publisher = MemoryJudgeStore(), ListPublisher(3)
    sources = [LocalSource({TOPIC: 3}), LocalSource({TOPIC: 3})]
    wall = Wall(0)
    old = judge_processor(sources[0], store, publisher, wall)
    live(old, publisher, sources[0], wall, messages)
    before = len(publisher.sent)
    # Another instance claims every partition (new epochs) while the old one still holds them.
    fill(sources[1], messages, 3)
    new = judge_processor(sources[1], store, publisher, wall)
    new.run_once()
    wall.now_ms = last + 1000
    old.run_once()
    assert old.exporter.registry.get_sample_value("stream_ndcg_fenced_batches_total") == 1
    assert len(publisher.sent) == before
    # The rebalance reaches the old instance: it lets the partitions go, and the new one decides.
    sources[0].assign([])
    old.run_once()
    assert not old.held
    run_until_quiet(new, publisher)
    assert deduplicated(publisher.sent) == decided_live(messages, last + 1000)


def test_a_partition_claimed_for_the_first_time_after_a_boundary_passes_it_with_nothing() -> None:
    """Partition 2 is first claimed after the wall passed boundary B: claimed before the others close
    B (a moment after B on its instance's wall), its clock starts past B and B is decided without it
    as soon as they close it; not claimed until after they wait at B, it holds B back until it is,
    then passes it at once. Either way it contributes nothing to B, and grades its pairs from the next."""
    everything = clicks_in_time_order(seed=12)
    boundary = first_boundary_after(everything)
    # One interval of events, whose minutes all end before B.
    messages = [(k, v) for k, v in everything if boundary - INTERVAL <= orjson.loads(v)["ts"] < boundary - MINUTE]
    earlier = [(k, v) for k, v in messages if zlib.crc32(k) % 3 != 2]
    queries = {n: {orjson.loads(v)["query_id"] for _, v in only_partition(messages, n, 3)} for n in range(3)}
    for late_ms in (boundary + 2000, boundary + 500):
        store, publisher = MemoryJudgeStore(), ListPublisher(3)
        sources = [LocalSource({TOPIC: 3}), LocalSource({TOPIC: 3})]
        sources[0].assign([Partition(TOPIC, 0), Partition(TOPIC, 1)])
        sources[1].assign([Partition(TOPIC, 2)])
        wall = Wall(0)
        early = judge_processor(sources[0], store, publisher, wall)
        live(early, publisher, sources[0], wall, messages)
        fill(sources[1], messages, 3)
        wall.now_ms = late_ms
        late = judge_processor(sources[1], store, publisher, wall)
        claimed_first = late_ms < boundary + 1000
        if claimed_first:
            for _ in range(3):
                late.run_once()
            status = store.statuses([f"{TOPIC}:2"])[f"{TOPIC}:2"]
            assert status.clock == late_ms and status.closed is None
        wall.now_ms = boundary + 1000
        run_until_quiet(early, publisher)
        assert bool(publisher.sent) == claimed_first
        wall.now_ms = max(late_ms, boundary + 1000)
        for _ in range(30):
            early.run_once()
            late.run_once()
        assert {m["ts"] for m in publisher.sent} == {boundary}
        assert {m["query_id"] for m in publisher.sent} <= queries[0] | queries[1]
        assert deduplicated(publisher.sent) == decided_live(earlier, boundary + 1000)
        assert store.statuses([f"{TOPIC}:2"])[f"{TOPIC}:2"].closed is None
        # Partition 2's pairs are graded at the next boundary.
        wall.now_ms = boundary + INTERVAL + 1000
        for _ in range(30):
            early.run_once()
            late.run_once()
        assert {m["query_id"] for m in publisher.sent if m["ts"] == boundary + INTERVAL} & queries[2]
