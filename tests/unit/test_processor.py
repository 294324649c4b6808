"""The real StreamProcessor on the in-memory source and store: whatever faults strike between
batches (lost commit replies, store outages, a stalled consumer, partitions taken away and given
back, another instance stealing a partition), the stored numbers equal the batch replay and no
event is counted twice."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Collection, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from stream_ndcg.config import Settings
from stream_ndcg.consumer import StreamProcessor
from stream_ndcg.engine import Engine
from stream_ndcg.errors import BrokerUnavailable, ConsumerStalled, StoreUnavailable, UndecodableRecords
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.offline.replay import Replay
from stream_ndcg.offline.totals import OVER_QUERIES
from stream_ndcg.pipeline import BatchPipeline, RecordChecks
from stream_ndcg.source.base import Partition, Record
from stream_ndcg.source.local import LocalSource
from stream_ndcg.state.base import Commit, CommitInFlight
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.windows import window_means
from stream_ndcg.wiring import processor_options

TOPIC = "events"
PARTITIONS = [Partition(TOPIC, 0), Partition(TOPIC, 1)]


class FlakyStore(MemoryStore):
    """The in-memory store, failing the next commit on demand: before writing it, or after
    writing it (the reply lost: the writer cannot tell it landed)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: str | None = None

    def commit(self, commits: Collection[Commit]) -> None:
        fault, self.fail_next = self.fail_next, None
        if fault == "before":
            raise StoreUnavailable("commit refused (test)")
        super().commit(commits)
        if fault == "after":
            raise StoreUnavailable("commit reply lost (test)")


def settings_for_test(**overrides: str) -> Settings:
    return Settings.load(flags={"topics": TOPIC, "k": "1,3", "clock": "event", "batch_size": "4",
                                "segment_labels": "", "windows": "1h", **overrides})


def processor(source: LocalSource, store: MemoryStore, **overrides: str) -> StreamProcessor:
    config = settings_for_test(**overrides)
    engine = Engine(config.measure, config.bucket)
    exporter = Exporter(CollectorRegistry(), store, WindowView(config.k, config.windows, config.bucket, (), True))
    pipeline = BatchPipeline(store, engine, RecordChecks(require_key=False), event_clock=True)
    made = StreamProcessor(source, store, pipeline, exporter, processor_options(config))
    made.backoff.base = made.backoff.cap = 0.0
    return made


def event(serial: int, query: int, kind: str, doc: int, grade: int) -> bytes:
    if kind == "impression":
        return json.dumps({"type": "impression", "impression_id": f"i{serial}", "query_id": f"q{query}",
                           "ts": serial * 1000, "results": [f"d{(doc + r) % 5}" for r in range(4)]}).encode()
    return json.dumps({"type": "judgment", "query_id": f"q{query}", "doc_id": f"d{doc}", "grade": grade,
                       "ts": serial * 1000}).encode()


streams = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["impression", "judgment"]), st.integers(0, 4),
                             st.integers(0, 3)), min_size=1, max_size=30)
faults = st.lists(st.sampled_from(["none", "commit-before", "commit-after", "broker", "stall", "rebalance",
                                   "stolen"]), max_size=30)


def fill(source: LocalSource, messages: list[bytes]) -> None:
    for message in messages:
        query = json.loads(message)["query_id"]
        # Keyed by query, as the contract asks: a query's events share a partition.
        source.append(TOPIC, int(query[1:]) % 2, key=query.encode(), value=message)


def drain(made: StreamProcessor, source: LocalSource, rounds: int = 200) -> None:
    for _ in range(rounds):
        made.run_once()
        positions = {p: made.ownership.claim(p).offset for p, _ in made.ownership.owned()}
        if made.ready() and all((positions.get(p) or 0) == len(source.logs[p]) for p in PARTITIONS):
            return
    raise AssertionError(f"not caught up after {rounds} cycles")


def assert_equals_replay(store: MemoryStore, messages: list[bytes]) -> None:
    config = settings_for_test()
    replay = Replay(config.measure)
    for message in messages:
        replay.add(message)
    expected = replay.summary()
    ours = window_means(store.aggregates(), config.k)
    for k, row in expected["k"].items():
        for name, value in row.items():
            if name in OVER_QUERIES:
                continue
            if value is None or name in ("impressions", "scored_impressions"):
                assert ours[k][name] == value, (k, name)
            else:
                assert abs(ours[k][name] - value) <= 1e-9, (k, name, ours[k][name], value)
    counts: Mapping[str, int] = store.counts()
    assert counts["impression"] == expected["events"]["impression"]
    assert counts["judgment"] == expected["events"]["judgment"]
    assert counts["duplicate:impression"] + counts["duplicate:judgment"] == expected["events"]["duplicate"]


@settings(max_examples=60)
@given(streams, faults)
def test_whatever_fails_between_batches_the_state_equals_the_replay(
        stream: list[tuple[int, str, int, int]], injected: list[str]) -> None:
    messages = [event(serial, *spec) for serial, spec in enumerate(stream)]
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    fill(source, messages)
    made = processor(source, store)
    assert made.start()
    for fault in injected:
        if fault == "commit-before":
            store.fail_next = "before"
        elif fault == "commit-after":
            store.fail_next = "after"
        elif fault == "broker":
            source.fail_next_poll(BrokerUnavailable("brokers gone (test)"))
        elif fault == "stall":
            source.fail_next_poll(ConsumerStalled("stalled (test)"))
        elif fault == "rebalance":
            source.assign([PARTITIONS[1]])
            made.run_once()
            source.assign(PARTITIONS)
        elif fault == "stolen":
            # Another instance claims a partition and writes nothing: our next write is fenced.
            store.claim(PARTITIONS[0].name)
        made.run_once()
    store.fail_next = None
    drain(made, source)
    assert_equals_replay(store, messages)


class RecordingStore(FlakyStore):
    """Says in `said` when a commit is sent and when one is written (with its next offsets)."""

    def __init__(self, said: list[str]) -> None:
        super().__init__()
        self.said = said

    def begin_commit(self, commits: Collection[Commit]) -> CommitInFlight:
        self.said.append(f"sent {[c.next_offset for c in commits]}")
        return super().begin_commit(commits)

    def commit(self, commits: Collection[Commit]) -> None:
        self.said.append(f"written {[c.next_offset for c in commits]}")
        super().commit(commits)


def test_a_full_batch_is_written_while_the_next_is_polled_and_a_smaller_one_at_once() -> None:
    said: list[str] = []
    source, store = LocalSource({TOPIC: 2}), RecordingStore(said)
    # Six events of q0, all in partition 0; batch_size is 4.
    fill(source, [event(serial, 0, "impression", serial % 5, 0) for serial in range(6)])
    made = processor(source, store)
    poll = source.poll

    def polled(timeout_ms: int, max_records: int) -> dict[Partition, list[Record]]:
        said.append("poll")
        return poll(timeout_ms, max_records)

    source.poll = polled  # type: ignore[method-assign]
    assert made.start()
    for _ in range(3):
        made.run_once()
    # The first poll's records come before the claims, and are read again after them.
    assert said == ["poll", "poll", "sent [4]", "poll", "written [4]", "written [6]"]
    assert store.next_offset(PARTITIONS[0].name) == 6
    assert made.ownership.claim(PARTITIONS[0]).offset == 6


def test_a_commit_in_flight_at_a_fault_is_read_and_the_stored_offsets_decide() -> None:
    said: list[str] = []
    source, store = LocalSource({TOPIC: 2}), RecordingStore(said)
    messages = [event(serial, 0, "impression", serial % 5, 0) for serial in range(8)]
    fill(source, messages)
    made = processor(source, store)
    assert made.start()
    made.run_once()  # claims
    made.run_once()  # sends a full batch
    source.fail_next_poll(BrokerUnavailable("brokers gone (test)"))
    made.run_once()
    # Read all the same (a Redis store's connection goes back to its pool), then let go.
    assert said == ["sent [4]", "written [4]"]
    assert len(made.ownership) == 0
    drain(made, source)
    assert_equals_replay(store, messages)


def test_a_stalled_source_is_closed_and_opened_again() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    made = processor(source, store)
    assert made.start() and source.opened == 1
    source.fail_next_poll(ConsumerStalled("stalled (test)"))
    made.run_once()
    assert (source.opened, source.closed) == (2, 1)
    assert made.exporter.registry.get_sample_value("stream_ndcg_backoffs_total", {"cause": "ConsumerStalled"}) == 1


def test_not_ready_during_a_store_outage_and_ready_after_it() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    messages = [event(serial, serial % 3, "impression", serial % 5, 0) for serial in range(12)]
    fill(source, messages)
    made = processor(source, store)
    assert made.start()
    made.run_once()
    assert made.ready()
    store.fail_next = "after"
    made.run_once()  # sends a full batch (batch_size records): its reply is read after the next poll
    made.run_once()
    assert not made.ready()
    assert made.exporter.registry.get_sample_value("stream_ndcg_ready") == 0
    drain(made, source)
    assert made.ready() and made.exporter.registry.get_sample_value("stream_ndcg_ready") == 1
    assert_equals_replay(store, messages)


def test_a_revoked_partition_is_neither_written_nor_reported() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    fill(source, [event(serial, 0, "impression", 1, 0) for serial in range(3)])
    made = processor(source, store)
    assert made.start()
    made.run_once()  # claims
    made.run_once()  # reads
    source.assign([PARTITIONS[1]])
    fill(source, [event(serial, 0, "impression", 1, 0) for serial in range(3, 6)])
    for _ in range(3):
        made.run_once()
    assert [p for p, _ in made.ownership.owned()] == [PARTITIONS[1]]
    assert store.next_offset(PARTITIONS[0].name) == 3
    registry = made.exporter.registry
    assert registry.get_sample_value("stream_ndcg_consumer_lag", {"topic": TOPIC, "partition": "0"}) is None
    assert registry.get_sample_value("stream_ndcg_assigned_partitions") == 1
    made.close()
    # Kafka keeps the last position committed for the partition while it was ours.
    assert source.committed == {PARTITIONS[0]: 3}
    assert Counter(store.counts())["impression"] == 3


def test_kafka_offsets_are_committed_at_most_every_commit_s_a_put_off_one_when_due_and_at_close() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    commits: list[dict[Partition, int]] = []
    commit = source.commit

    def recorded(offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        commits.append(dict(offsets))
        commit(offsets, asynchronous=asynchronous)

    source.commit = recorded  # type: ignore[method-assign]
    made = processor(source, store)
    now = [1000.0]
    made.lag.clock = lambda: now[0]
    assert made.start()
    fill(source, [event(serial, 0, "impression", serial % 5, 0) for serial in range(3)])
    drain(made, source)
    fill(source, [event(serial, serial, "impression", serial % 5, 0) for serial in range(3, 10)])
    drain(made, source)
    # Batches stored in both partitions; only the first moved Kafka's offsets.
    assert store.next_offset(PARTITIONS[0].name) == 6 and store.next_offset(PARTITIONS[1].name) == 4
    assert commits == [{PARTITIONS[0]: 3}]
    made.run_once()
    assert len(commits) == 1
    # The put-off commit is made once due, by a cycle without records.
    now[0] += made.lag.COMMIT_S
    made.run_once()
    assert commits[-1] == {PARTITIONS[0]: 6, PARTITIONS[1]: 4}
    made.run_once()
    assert len(commits) == 2
    fill(source, [event(10, 0, "impression", 0, 0)])
    drain(made, source)
    made.close()
    assert commits[-1] == source.committed == {PARTITIONS[0]: 7, PARTITIONS[1]: 4}


def lost_records_setup(fail_on_data_loss: bool) -> tuple[StreamProcessor, LocalSource, FlakyStore, list[bytes]]:
    """Partition 0 read up to offset 4, then offsets 4 to 7 deleted before the processor comes back."""
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    first = [event(serial, 0, "impression", serial % 5, 0) for serial in range(4)]
    fill(source, first)
    made = processor(source, store)
    assert made.start()
    drain(made, source)
    made.close()
    later = [event(serial, 0, "impression", serial % 5, 0) for serial in range(4, 12)]
    fill(source, later)
    source.delete_records(TOPIC, 0, 8)
    again = processor(source, store, fail_on_data_loss=str(fail_on_data_loss).lower())
    assert again.start()
    return again, source, store, first + later[4:]


def test_records_deleted_before_they_were_read_are_skipped_counted_once_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    made, source, store, kept = lost_records_setup(fail_on_data_loss=False)
    drain(made, source)
    assert made.exporter.registry.get_sample_value(
        "stream_ndcg_offsets_skipped_total", {"topic": TOPIC, "partition": "0"}) == 4
    assert "events:0: 4 offsets (4 to 7) were deleted from Kafka before they were read" in caplog.text
    assert store.next_offset("events:0") == 12
    assert_equals_replay(store, kept)


def test_with_fail_on_data_loss_the_partition_is_halted_and_the_service_not_ready(
        caplog: pytest.LogCaptureFixture) -> None:
    made, source, store, _ = lost_records_setup(fail_on_data_loss=True)
    for _ in range(5):
        made.run_once()
    assert not made.ready()
    assert made.exporter.registry.get_sample_value("stream_ndcg_ready") == 0
    assert store.next_offset("events:0") == 4
    assert caplog.text.count("not reading the partition") == 1


def started_and_logging(caplog: pytest.LogCaptureFixture) -> tuple[StreamProcessor, LocalSource]:
    """A processor past its first cycle over both partitions, its log captured from DEBUG on."""
    caplog.set_level(logging.DEBUG, logger="stream_ndcg.consumer")
    source = LocalSource({TOPIC: 2})
    made = processor(source, FlakyStore())
    assert made.start()
    made.run_once()
    return made, source


def test_an_undecodable_batch_is_said_once_and_holds_readiness_until_its_partition_moves_on(
        caplog: pytest.LogCaptureFixture) -> None:
    made, source = started_and_logging(caplog)
    assert made.ready()
    fault = UndecodableRecords("zstd", TOPIC, 0, 7, "install the Python package zstandard, a dependency")
    source.fail_next_poll(fault)
    made.run_once()
    assert not made.ready()
    made.run_once()  # polls between the failing ones do not end the fault
    assert not made.ready() and len(made.ownership) == 2
    source.fail_next_poll(fault)
    made.run_once()
    fill(source, [event(0, 0, "impression", 1, 0)])
    made.run_once()  # a batch smaller than batch_size: its reply is read at once
    assert made.ready()
    assert made.exporter.registry.get_sample_value("stream_ndcg_backoffs_total", {"cause": "UndecodableRecords"}) == 2
    said = [r.levelno for r in caplog.records if "compressed with zstd" in r.getMessage()]
    assert said == [logging.ERROR, logging.DEBUG]


def test_an_undecodable_batch_is_said_once_even_when_a_rebalance_hands_its_partition_back(
        caplog: pytest.LogCaptureFixture) -> None:
    made, source = started_and_logging(caplog)
    fault = UndecodableRecords("zstd", TOPIC, 1, 3, "install the Python package zstandard, a dependency")
    source.fail_next_poll(fault)
    made.run_once()
    # The group takes the partition away and gives it straight back; the batch fails again.
    source.assign([PARTITIONS[0]])
    source.assign(PARTITIONS)
    made.run_once()
    source.fail_next_poll(fault)
    made.run_once()
    assert not made.ready()
    said = [r.levelno for r in caplog.records if "compressed with zstd" in r.getMessage()]
    assert said == [logging.ERROR, logging.DEBUG]
