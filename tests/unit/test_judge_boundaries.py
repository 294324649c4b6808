"""How `judge` passes boundaries when its partitions start at different times: a partition whose
clock starts past boundary B (its first event comes after the other partitions closed B, or it is
ahead of them; on the wall clock, it is first claimed late in a long cycle) contributes nothing to
B and grades nothing at B, and every other partition closes each boundary once, in order, with
its own counts. So no boundary waits for a partition that is never idle, and the grades of B do
not depend on how the partitions interleave: on the event clock they are the ones a single judge
reading the whole stream in time order decides."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from stream_ndcg.click_judge import ClickJudge
from stream_ndcg.click_models import RankCounts, summed
from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.exporter import Exporter
from stream_ndcg.judge_loop import JudgeOptions, JudgeProcessor
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.pipeline import RecordChecks
from stream_ndcg.source.local import LocalSource
from stream_ndcg.state.judge_store import MemoryJudgeStore
from tests.unit.test_judge_loop import (
    SETTINGS,
    TOPIC,
    ListPublisher,
    clicks_in_time_order,
    deduplicated,
    expected,
    fill,
    run_until_quiet,
)

INTERVAL = SETTINGS.interval_ms
PARTITIONS = 3


def partition_of(key: bytes) -> int:
    return zlib.crc32(key) % PARTITIONS


def ts_of(value: bytes) -> int:
    found: int = orjson.loads(value)["ts"]
    return found


def event_processor(source: LocalSource, store: MemoryJudgeStore, publisher: ListPublisher) -> JudgeProcessor:
    """`judge` on the event clock whose partitions are never idle: only events pass boundaries."""
    exporter = Exporter(CollectorRegistry(), None, None, judge=JudgeCollector(store, "test", "coec"))
    options = JudgeOptions((TOPIC,), linger_ms=0, batch_size=200, start_from="earliest", idle_ms=10**9,
                           checks=RecordChecks(require_key=True))
    made = JudgeProcessor(source, store, publisher, exporter, options, SETTINGS)
    assert made.start()
    return made


def closing_impressions(end_ms: int) -> list[tuple[bytes, bytes]]:
    """One impression per partition at `end_ms`, so that every partition passes the boundaries
    before it (nothing is idle here)."""
    found: dict[int, tuple[bytes, bytes]] = {}
    n = 0
    while len(found) < PARTITIONS:
        key = f"closing-{n}".encode()
        found.setdefault(partition_of(key), (key, orjson.dumps({
            "type": "impression", "impression_id": f"closing-{n}", "query_id": key.decode(), "ts": end_ms,
            "results": ["d1"]})))
        n += 1
    return [found[p] for p in range(PARTITIONS)]


def late_partition_stream(seed: int, intervals_late: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """A stream in time order in which partition 2's first event comes `intervals_late` intervals
    after the first boundary the others close; and that first boundary."""
    messages = clicks_in_time_order(events=900, seed=seed)
    first = (ts_of(messages[0][1]) // INTERVAL + 1) * INTERVAL
    start = first + intervals_late * INTERVAL + INTERVAL // 3
    kept = [(k, v) for k, v in messages if partition_of(k) != 2 or ts_of(v) >= start]
    end = (ts_of(kept[-1][1]) // INTERVAL + 2) * INTERVAL
    return kept + closing_impressions(end), first


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(20, 40), intervals_late=st.integers(0, 3), appended_late=st.booleans())
def test_a_partition_whose_first_event_is_past_a_closed_boundary_does_not_hold_it(
        seed: int, intervals_late: int, appended_late: bool) -> None:
    """Event clock, no partition ever idle: partition 2's first event is after boundary B that
    partitions 0 and 1 closed (`appended_late`: its records reach Kafka once they wait at B), or
    it reads ahead of them and closes a later boundary first. Every boundary is decided, with
    the judgments one judge of the whole stream decides."""
    messages, first = late_partition_stream(seed, intervals_late)
    source, store, publisher = LocalSource({TOPIC: PARTITIONS}), MemoryJudgeStore(), ListPublisher(PARTITIONS)
    made = event_processor(source, store, publisher)
    if appended_late:
        fill(source, [(k, v) for k, v in messages if partition_of(k) != 2], PARTITIONS)
        run_until_quiet(made, publisher)
        statuses = store.statuses([f"{TOPIC}:{n}" for n in range(PARTITIONS)])
        assert [statuses[f"{TOPIC}:{n}"].waiting for n in range(2)] == [first, first] and publisher.sent == []
        fill(source, [(k, v) for k, v in messages if partition_of(k) == 2], PARTITIONS)
    else:
        fill(source, messages, PARTITIONS)
    run_until_quiet(made, publisher)
    want = sorted(expected(messages, SETTINGS.grading), key=lambda m: (m["ts"], m["query_id"], m["doc_id"]))
    assert len({m["ts"] for m in want}) >= 4
    assert deduplicated(publisher.sent) == want


class ScriptedWall:
    """The injected wall clock: the times in `script`, one per reading, then the last for good (a
    cycle that reads it once per partition takes as long as the script says)."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)

    def __call__(self) -> float:
        now = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return now / 1000

    def set(self, now_ms: int) -> None:
        self.script = [now_ms]


def wall_processor(source: LocalSource, store: MemoryJudgeStore, publisher: ListPublisher,
                   wall: ScriptedWall) -> JudgeProcessor:
    exporter = Exporter(CollectorRegistry(), None, None, judge=JudgeCollector(store, "test", "coec"))
    options = JudgeOptions((TOPIC,), linger_ms=0, batch_size=2000, start_from="earliest", idle_ms=10**9,
                           checks=RecordChecks(require_key=True), wall_clock=True)
    made = JudgeProcessor(source, store, publisher, exporter, options, SETTINGS, clock=wall)
    assert made.start()
    return made


def decided_with_starts(by_partition: dict[int, list[bytes]], starts: dict[int, int],
                        boundaries: list[int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Judges fed the same boundaries: partition n's takes its events in at wall time `starts[n]`;
    at each boundary after its start it closes it, and every judge that closed it grades with the
    rank counts of all that did. The judgments, and how many boundaries each judge decided."""
    judges = {n: ClickJudge(SETTINGS) for n in by_partition}
    for n, values in by_partition.items():
        judges[n].advance(starts[n])
        for value in values:
            event = parse_event(value)
            assert isinstance(event, Impression | Click)
            judges[n].take(event)
    found: list[dict[str, Any]] = []
    for boundary in boundaries:
        closing = [n for n in judges if starts[n] < boundary]
        ranks = []
        for n in closing:
            judges[n].close(boundary)
            ranks.append(judges[n].stats.rank_counts(judges[n].oldest_bucket(boundary)))
        ctr: RankCounts = summed(ranks, SETTINGS.max_rank)
        for n in closing:
            found.extend(j.message() for j in judges[n].emit(boundary, ctr))
    return sorted(found, key=lambda m: (m["ts"], m["query_id"], m["doc_id"])), \
        {n: judge.boundaries for n, judge in judges.items()}


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(50, 70), lateness=st.lists(st.integers(0, 3 * INTERVAL), min_size=2, max_size=2))
# The last partition starting on a boundary: every partition decides the last boundary at once.
@example(seed=50, lateness=[0, 60_000])
def test_a_first_cycle_longer_than_the_interval_closes_each_boundary_once_in_order(
        seed: int, lateness: list[int]) -> None:
    """Wall clock: the first cycle claims the three partitions and reads the wall once per
    partition; it takes so long that several boundaries pass between partition 0's reading and
    the others'. Each partition closes each boundary after its start once, in order, with the
    counts of what it took in before it; a partition started past a boundary contributes nothing
    to it, and no boundary waits for it."""
    everything = clicks_in_time_order(events=600, seed=seed)
    begin = (ts_of(everything[-1][1]) // INTERVAL + 1) * INTERVAL
    # Partition 0 reads the wall a minute before `begin + INTERVAL`; the others later in the cycle.
    starts = {0: begin + INTERVAL - 60_000}
    starts[1] = starts[0] + lateness[0]
    starts[2] = starts[1] + lateness[1]
    source, store, publisher = LocalSource({TOPIC: PARTITIONS}), MemoryJudgeStore(), ListPublisher(PARTITIONS)
    fill(source, everything, PARTITIONS)
    wall = ScriptedWall([starts[0], starts[1], starts[2]])
    made = wall_processor(source, store, publisher, wall)
    # The first cycle claims the partitions; the second reads the wall for each.
    made.run_once()
    made.run_once()
    assert all(store.statuses([f"{TOPIC}:{n}"])[f"{TOPIC}:{n}"].clock == starts[n] for n in range(PARTITIONS))
    end = (starts[2] // INTERVAL + 3) * INTERVAL + 1000
    for now_ms in [*range(starts[2], end, INTERVAL // 2), end]:
        wall.set(now_ms)
        run_until_quiet(made, publisher)
    boundaries = list(range(begin + INTERVAL, end, INTERVAL))
    by_partition = {n: [v for k, v in everything if partition_of(k) == n] for n in range(PARTITIONS)}
    want, decided = decided_with_starts(by_partition, starts, boundaries)
    assert want and {m["ts"] for m in want} <= set(boundaries)
    assert deduplicated(publisher.sent) == want
    # Each judgment once, each partition's in boundary order.
    assert len(publisher.sent) == len(want)
    for n in range(PARTITIONS):
        sent = [m["ts"] for m in publisher.sent if partition_of(m["query_id"].encode()) == n]
        assert sent == sorted(sent)
    stored = {n: ClickJudge.from_state(SETTINGS, store.load(f"{TOPIC}:{n}").state) for n in range(PARTITIONS)}
    assert {n: judge.boundaries for n, judge in stored.items()} == decided
    # A cycle that only moves the wall clock writes nothing, so the stored clock is where the last
    # boundary was decided: at or past it, never past the wall.
    assert all(judge.closed == boundaries[-1] and judge.clock_ms is not None and boundaries[-1] <= judge.clock_ms <= end
               for judge in stored.values())
