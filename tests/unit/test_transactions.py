"""What a read-committed consumer sees of transactional producers, on the in-memory source: markers
take offsets no record shows, aborted records are never returned, and an open transaction holds its
partition back. The stored offsets reach the end of what is committed, the lag reaches 0, and the
numbers equal the replay of the committed events alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_ndcg.consumer import StreamProcessor
from stream_ndcg.source.local import LocalSource
from tests.unit.test_processor import PARTITIONS, TOPIC, FlakyStore, assert_equals_replay, drain, event, processor


def transactional(made: StreamProcessor) -> StreamProcessor:
    # Every cycle asks for the lag, so that a test sees it without waiting for the clock.
    made.lag.CHECK_S = 0.0
    return made


def lag(made: StreamProcessor, partition: int) -> float | None:
    return made.exporter.registry.get_sample_value("stream_ndcg_consumer_lag",
                                                   {"topic": TOPIC, "partition": str(partition)})


def held_back(made: StreamProcessor, partition: int) -> float | None:
    return made.exporter.registry.get_sample_value("stream_ndcg_consumer_held_back_offsets",
                                                   {"topic": TOPIC, "partition": str(partition)})


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["impression", "judgment"]), st.integers(0, 4),
                          st.integers(0, 3), st.booleans()), min_size=1, max_size=30))
def test_markers_move_the_stored_offset_to_the_end_and_the_numbers_equal_the_replay(
        stream: list[tuple[int, str, int, int, bool]]) -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    messages = []
    for serial, (query, kind, doc, grade, marker_after) in enumerate(stream):
        message = event(serial, query, kind, doc, grade)
        messages.append(message)
        source.append(TOPIC, query, key=f"q{query}".encode(), value=message)
        if marker_after:
            source.append_marker(TOPIC, query)
    made = transactional(processor(source, store))
    assert made.start()
    drain(made, source)
    made.run_once()
    for partition in PARTITIONS:
        assert store.next_offset(partition.name) in (None, len(source.logs[partition]))
    assert_equals_replay(store, messages)
    for number, partition in enumerate(PARTITIONS):
        if source.logs[partition]:
            assert lag(made, number) == 0


def test_a_trailing_marker_alone_is_committed_as_an_offset_without_records() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    messages = [event(serial, 0, "impression", 1, 0) for serial in range(3)]
    for message in messages:
        source.append(TOPIC, 0, key=b"q0", value=message)
    source.append_marker(TOPIC, 0)
    made = transactional(processor(source, store))
    assert made.start()
    drain(made, source)
    made.run_once()
    assert store.next_offset(PARTITIONS[0].name) == 4
    assert lag(made, 0) == 0 and held_back(made, 0) == 0
    made.close()
    assert source.committed[PARTITIONS[0]] == 4
    assert_equals_replay(store, messages)


def test_an_open_transaction_holds_its_partition_back_and_says_by_how_much() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    committed = [event(serial, 0, "impression", 1, 0) for serial in range(2)]
    for message in committed:
        source.append(TOPIC, 0, key=b"q0", value=message)
    source.open_transaction(TOPIC, 0)
    pending = [event(serial, 0, "impression", 2, 0) for serial in range(2, 5)]
    for message in pending:
        source.append(TOPIC, 0, key=b"q0", value=message)
    made = transactional(processor(source, store))
    assert made.start()
    for _ in range(5):
        made.run_once()
    assert store.next_offset(PARTITIONS[0].name) == 2
    assert lag(made, 0) == 0 and held_back(made, 0) == 3
    assert_equals_replay(store, committed)
    source.append_marker(TOPIC, 0)
    source.close_transaction(TOPIC, 0)
    drain(made, source)
    made.run_once()
    assert store.next_offset(PARTITIONS[0].name) == 6
    assert lag(made, 0) == 0 and held_back(made, 0) == 0
    assert_equals_replay(store, committed + pending)


def test_an_offsets_only_commit_is_fenced_like_any_other() -> None:
    source, store = LocalSource({TOPIC: 2}), FlakyStore()
    source.append(TOPIC, 0, key=b"q0", value=event(0, 0, "impression", 1, 0))
    made = transactional(processor(source, store))
    assert made.start()
    drain(made, source)
    source.append_marker(TOPIC, 0)
    # Another instance claims the partition: its epoch fences ours.
    store.claim(PARTITIONS[0].name)
    made.run_once()  # polls past the marker; the offsets-only commit is refused
    assert made.exporter.registry.get_sample_value("stream_ndcg_fenced_batches_total") == 1
    # Refused: the offset stays, and the partition, still assigned to us, is claimed again from it.
    assert store.next_offset(PARTITIONS[0].name) == 1
    assert made.ownership.claim(PARTITIONS[0]).offset == 1
    made.run_once()
    assert store.next_offset(PARTITIONS[0].name) == 2
