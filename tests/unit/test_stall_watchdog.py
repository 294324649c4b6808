"""The processor notices a consumer that returns no records for partitions that have some (the
kafka-python 3.0 fault seen in the integration tests, dpkp/kafka-python#3131) and rejoins with a
new consumer. The consumer here is a stand-in that never returns records: the fault cannot be
caused on demand in a real one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafka import TopicPartition
from prometheus_client import CollectorRegistry

from stream_ndcg.config import Settings
from stream_ndcg.consumer import StreamProcessor
from stream_ndcg.engine import Engine
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.store import MemoryStore

PARTITIONS = [TopicPartition("events", 0), TopicPartition("events", 1)]


class SilentConsumer:
    """Assigned both partitions, positioned at offset 0, returning nothing from poll."""

    def __init__(self, end_offset: int) -> None:
        self.end_offset = end_offset
        self.closed = False
        self._coordinator = SimpleNamespace(coordinator_id=1)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set(PARTITIONS)

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        pass

    def end_offsets(self, partitions: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, self.end_offset)

    def position(self, tp: TopicPartition, timeout_ms: int) -> int:
        return 0

    def highwater(self, tp: TopicPartition) -> None:
        return None

    def close(self, autocommit: bool) -> None:
        self.closed = True


def processor(end_offset: int) -> tuple[StreamProcessor, list[SilentConsumer]]:
    made: list[SilentConsumer] = []

    def connect() -> SilentConsumer:
        made.append(SilentConsumer(end_offset))
        return made[-1]

    store = MemoryStore()
    exporter = Exporter(CollectorRegistry(), store, WindowView((10,), (60_000,), 60_000, (), False))
    settings = Settings.load(flags={"topics": "events"})
    made_processor = StreamProcessor(connect, store, Engine(Measure(cutoffs=(10,))), exporter, settings)
    made_processor.STALL_CHECK_S = 0.0
    made_processor.backoff.base = made_processor.backoff.cap = 0.0
    return made_processor, made


def run_cycles(made: StreamProcessor, cycles: int) -> None:
    assert made._connect_consumer()
    made._subscribe()
    for _ in range(cycles):
        try:
            made._cycle()
        except Exception as exc:  # noqa: BLE001 - the loop's own handling is under test
            made._recover(exc)  # type: ignore[arg-type]


def test_partitions_with_records_the_consumer_never_returns_make_it_rejoin() -> None:
    made, consumers = processor(end_offset=10)
    run_cycles(made, 3)
    assert len(consumers) >= 2 and consumers[0].closed
    assert made.exporter.backoffs.labels(cause="ConsumerStalled")._value.get() >= 1


def test_quiet_partitions_with_nothing_to_read_are_left_alone() -> None:
    made, consumers = processor(end_offset=0)
    run_cycles(made, 3)
    assert len(consumers) == 1 and not consumers[0].closed
    assert made.exporter.backoffs.labels(cause="ConsumerStalled")._value.get() == 0
    assert len(made._owned) == 2
