"""The kafka-python adapter notices a consumer that returns no records for partitions that have
some (the kafka-python 3.0 fault seen in the integration tests, dpkp/kafka-python#3131), and an
empty poll without a group coordinator. The consumer here is a stand-in of kafka-python's that
never returns records: neither fault can be caused on demand in a real one."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError, UnsupportedCodecError
from kafka.structs import MemberState

from stream_ndcg.errors import BrokerUnavailable, ConsumerStalled, UndecodableRecords
from stream_ndcg.source.base import Partition
from stream_ndcg.source.kafka import KafkaSource

ASSIGNED = [TopicPartition("events", 0), TopicPartition("events", 1)]


class SilentConsumer:
    """Assigned both partitions at offset 0, returning nothing from poll."""

    def __init__(self, end_offset: int, coordinator_id: int | None = 1) -> None:
        self.end_offset = end_offset
        # What kafka-python's poll() leaves there: None once the coordinator is lost.
        self._coordinator = SimpleNamespace(coordinator_id=coordinator_id, state=MemberState.STABLE)
        self.sought: list[tuple[TopicPartition, int]] = []

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    def topics(self) -> set[str]:
        return {"events"}

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set(ASSIGNED)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought.append((tp, offset))

    def end_offsets(self, partitions: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, self.end_offset)

    def position(self, tp: TopicPartition, timeout_ms: int) -> int:
        return 0


def source_over(consumer: SilentConsumer) -> KafkaSource:
    source = KafkaSource(lambda: consumer)
    source.STALL_CHECK_S = 0.0
    source.open()
    source.subscribe(["events"])
    return source


def test_partitions_with_records_the_consumer_never_returns_raise_consumer_stalled() -> None:
    source = source_over(SilentConsumer(end_offset=10))
    source.poll(10, 10)  # the first check finds every partition freshly assigned
    with pytest.raises(ConsumerStalled, match="events:0, events:1"):
        source.poll(10, 10)


class BusyConsumer(SilentConsumer):
    """Returns full polls of partition 0's records, then short ones; partition 1 never gives any."""

    def __init__(self, full_polls: int) -> None:
        super().__init__(end_offset=10)
        self.full_polls = full_polls

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        if self.full_polls:
            self.full_polls -= 1
            return {ASSIGNED[0]: [object()] * max_records}
        return {ASSIGNED[0]: [object()]}


def test_a_quiet_partition_is_not_stalled_while_every_poll_comes_back_full() -> None:
    # A consumer catching up more slowly than it fetches: kafka-python hands out partition 0's
    # fetched records first, and partition 1 waits its turn.
    source = source_over(BusyConsumer(full_polls=4))
    for _ in range(5):
        source.poll(10, 10)
    # The fifth poll came back short: partition 1, quiet and behind, is stalled at the next check.
    with pytest.raises(ConsumerStalled, match="events:1"):
        source.poll(10, 10)


def test_quiet_partitions_with_nothing_to_read_are_left_alone() -> None:
    source = source_over(SilentConsumer(end_offset=0))
    for _ in range(3):
        assert source.poll(10, 10) == {}


def test_an_empty_poll_without_a_group_coordinator_means_the_brokers_are_gone() -> None:
    source = source_over(SilentConsumer(end_offset=0, coordinator_id=None))
    with pytest.raises(BrokerUnavailable, match="coordinator"):
        source.poll(10, 10)


def test_a_member_left_out_of_its_group_is_reopened_after_a_while() -> None:
    consumer = SilentConsumer(end_offset=0)
    source = source_over(consumer)
    source.UNSTABLE_GROUP_S = 0.05
    consumer._coordinator.state = MemberState.REBALANCING
    source.poll(10, 10)  # noticed
    time.sleep(0.1)  # the time itself is what is tested: longer than UNSTABLE_GROUP_S
    with pytest.raises(ConsumerStalled, match="not a stable member.*rebalancing"):
        source.poll(10, 10)


def test_a_member_that_becomes_stable_again_is_left_alone() -> None:
    consumer = SilentConsumer(end_offset=0)
    source = source_over(consumer)
    source.UNSTABLE_GROUP_S = 0.05
    consumer._coordinator.state = MemberState.REBALANCING
    source.poll(10, 10)
    consumer._coordinator.state = MemberState.STABLE
    source.poll(10, 10)
    time.sleep(0.1)
    consumer._coordinator.state = MemberState.REBALANCING
    source.poll(10, 10)  # a new rebalance: its clock starts now


def test_partitions_are_named_and_sought_as_kafka_python_expects() -> None:
    consumer = SilentConsumer(end_offset=0)
    source = source_over(consumer)
    assert source.assignment() == {Partition("events", 0), Partition("events", 1)}
    source.seek(Partition("events", 1), 42, "earliest")
    assert consumer.sought == [(TopicPartition("events", 1), 42)]


def test_a_batch_without_its_codec_library_is_named_and_the_fetcher_unjammed() -> None:
    consumer = SilentConsumer(end_offset=0)
    drained: list[bool] = []

    def poll(timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        # What kafka-python 3.0.12 leaves behind: the fetcher's records in progress, not drained.
        consumer._fetcher = SimpleNamespace(_next_partition_records=SimpleNamespace(  # type: ignore[attr-defined]
            topic_partition=ASSIGNED[0], next_fetch_offset=7, drain=lambda: drained.append(True)))
        raise UnsupportedCodecError("Libraries for zstd compression codec not found")

    consumer.poll = poll  # type: ignore[method-assign]
    with pytest.raises(UndecodableRecords) as raised:
        source_over(consumer).poll(10, 10)
    assert (raised.value.codec, raised.value.topic, raised.value.partition, raised.value.offset) == (
        "zstd", "events", 0, 7)
    assert "install the Python package zstandard" in str(raised.value)
    assert drained == [True]


class UnrefreshedConsumer(SilentConsumer):
    """Its metadata refresh times out, as kafka-python's does when the brokers go away, leaving the
    cluster asking for every topic's metadata."""

    def __init__(self) -> None:
        super().__init__(end_offset=0)
        self._cluster = SimpleNamespace(need_all_topic_metadata=False)

    def topics(self) -> set[str]:
        self._cluster.need_all_topic_metadata = True
        raise KafkaTimeoutError("metadata")


def test_a_metadata_refresh_that_fails_at_subscribe_is_said_and_undone(caplog: pytest.LogCaptureFixture) -> None:
    consumer = UnrefreshedConsumer()
    with caplog.at_level("INFO", logger="stream_ndcg.source.kafka"):
        source = source_over(consumer)
    assert "topic metadata not refreshed before joining the group: KafkaTimeoutError" in caplog.text
    assert consumer._cluster.need_all_topic_metadata is False
    assert source.poll(10, 10) == {}
