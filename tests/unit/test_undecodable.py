"""The processor's handling of a batch it cannot decompress: said once, not ready until the
partition moves past it, backing off meanwhile. The consumer is a stand-in shaped as kafka-python
3.0's leaves itself after UnsupportedCodecError (the real one is in
tests/integration/test_compression.py, against a real broker)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import UnsupportedCodecError
from prometheus_client import CollectorRegistry

from stream_ndcg.config import Settings
from stream_ndcg.consumer import StreamProcessor
from stream_ndcg.engine import Engine
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.store import MemoryStore

STUCK = TopicPartition("events", 0)
FAULT = "cannot decode the records of events:0 at offset 7: compressed with zstd"


def impression(offset: int) -> SimpleNamespace:
    value = json.dumps({"type": "impression", "impression_id": f"i{offset}", "query_id": "q",
                        "ts": 1_763_683_200_000, "results": ["a"], "segment": {"variant": "A"}}).encode()
    return SimpleNamespace(topic=STUCK.topic, partition=STUCK.partition, offset=offset, key=b"q", value=value)


class ScriptedConsumer:
    """Assigned events:0 and events:1; each poll plays the next step of a script, then asks the
    processor to stop. A step is records to return, or "zstd": raise as kafka-python does for a
    zstd batch it has no library for, with the fetcher's records in progress at offset 7."""

    def __init__(self, script: list[Any], processor: list[StreamProcessor]) -> None:
        self.script: Iterator[Any] = iter(script)
        self.processor = processor
        self.ready_at_poll: list[bool] = []
        self.drained = 0
        self._coordinator = SimpleNamespace(coordinator_id=1)
        self._fetcher = SimpleNamespace(_next_partition_records=None)

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self.ready_at_poll.append(self.processor[0].ready())
        step = next(self.script, None)
        if step is None:
            self.processor[0].shutdown()
            return {}
        if step == "zstd":
            self._fetcher._next_partition_records = SimpleNamespace(
                topic_partition=STUCK, next_fetch_offset=7, drain=self._drain)
            raise UnsupportedCodecError("Libraries for zstd compression codec not found")
        return step  # type: ignore[no-any-return]

    def _drain(self) -> None:
        self.drained += 1

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    def assignment(self) -> set[TopicPartition]:
        return {STUCK, TopicPartition("events", 1)}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass

    def seek_to_beginning(self, tp: TopicPartition) -> None:
        pass

    def highwater(self, tp: TopicPartition) -> None:
        return None

    def commit_async(self, offsets: Any) -> None:
        pass

    def commit(self, offsets: Any) -> None:
        pass

    def close(self, autocommit: bool) -> None:
        pass


def run(script: list[Any]) -> tuple[StreamProcessor, ScriptedConsumer]:
    store = MemoryStore()
    exporter = Exporter(CollectorRegistry(), store, WindowView((10,), (86_400_000,), 60_000, (), False))
    settings = Settings.load(flags={"topics": "events", "clock": "event"})
    holder: list[StreamProcessor] = []
    consumer = ScriptedConsumer(script, holder)
    processor = StreamProcessor(lambda: consumer, store, Engine(Measure(cutoffs=(10,))), exporter, settings)
    holder.append(processor)
    processor.backoff.base = processor.backoff.cap = 0.0
    processor.run()
    return processor, consumer


def test_said_once_not_ready_until_the_partition_moves_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stream_ndcg.consumer")
    processor, consumer = run([{}, "zstd", {}, "zstd", {}, {STUCK: [impression(7), impression(8)]}, {}])
    # Ready after the first poll; not ready from the first failure until events:0 committed past it.
    assert consumer.ready_at_poll == [False, True, False, False, False, False, True, True]
    assert consumer.drained == 2
    assert processor.exporter.backoffs.labels(cause="UndecodableRecords")._value.get() == 2
    said = [(r.levelno, r.getMessage()) for r in caplog.records if FAULT in r.getMessage()]
    assert [level for level, _ in said] == [logging.ERROR, logging.DEBUG]
    assert "install the Python package zstandard" in said[0][1]
    assert processor.store.next_offset("events:0") == 9
