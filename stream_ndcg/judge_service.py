"""`stream-ndcg judge`: builds the judge's store, source, publisher, exporter and loop from
settings, and runs them (`judge_loop.JudgeProcessor` is the loop).

The judge reads `topics` as a consumer group of its own (`judge_group_id`), keeps its state under
the namespace of `run` (`{ns}:judge:...`), and publishes each judgment back to the topic and
partition it was derived from: `run` keeps a query's state with the input partition its events
come from, so a judgment must reach `run` on its query's partition of the same topic (the judge
reads its own judgments there, and counts them as judgments it does not use). Its boundaries go
by `clock` as `run`'s windows do: the wall clock, or each partition's event clock.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from stream_ndcg import wiring
from stream_ndcg.config import Settings
from stream_ndcg.errors import BrokerUnavailable
from stream_ndcg.exporter import Exporter
from stream_ndcg.judge_loop import JudgeOptions, JudgeProcessor
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.source.base import Partition
from stream_ndcg.source.kafka import KafkaSource, consumer_options

logger = logging.getLogger(__name__)


class KafkaPublisher:
    """Publishes judgment events keyed by their query id, with acks from every in-sync replica and
    the idempotent producer (a retried send is not written twice)."""

    def __init__(self, connect_producer: Callable[[], KafkaProducer]) -> None:
        self._connect = connect_producer
        self._producer: KafkaProducer | None = None

    @property
    def producer(self) -> KafkaProducer:
        # Created on first use, inside the loop's backoff: the brokers may be down at start.
        if self._producer is None:
            try:
                self._producer = self._connect()
            except KafkaError as exc:
                raise BrokerUnavailable(f"judgments producer cannot connect: {type(exc).__name__}") from exc
        return self._producer

    def publish(self, partition: Partition, messages: Sequence[bytes]) -> None:
        try:
            futures = [self.producer.send(partition.topic, key=orjson.loads(m)["query_id"].encode(), value=m,
                                          partition=partition.partition) for m in messages]
            self.producer.flush(timeout=30)
        except KafkaError as exc:
            raise BrokerUnavailable(f"judgments not published to {partition.name}: {exc}") from exc
        failed = [future for future in futures if not future.succeeded()]
        if failed:
            raise BrokerUnavailable(f"{len(failed)} judgment(s) not acknowledged by {partition.name}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None


def build(settings: Settings, registry: CollectorRegistry | None = None) -> tuple[JudgeProcessor, Exporter]:
    store = wiring.judge_store(settings)
    exporter = Exporter(registry or CollectorRegistry(), None, None,
                        revision=os.environ.get("STREAM_NDCG_REVISION", "unknown"),
                        judge=JudgeCollector(store, settings.key_namespace, settings.click_model))
    kafka_options = settings.kafka_client_options()
    options = consumer_options(kafka_options, group_id=settings.judge_group_id,
                               auto_offset_reset=settings.auto_offset_reset, batch_size=settings.batch_size,
                               max_message_bytes=settings.max_message_bytes)
    producer_options: dict[str, Any] = dict(kafka_options, acks="all", enable_idempotence=True, linger_ms=5)
    publisher = KafkaPublisher(lambda: KafkaProducer(**producer_options))
    judge_options = JudgeOptions(topics=settings.topics, linger_ms=settings.linger, batch_size=settings.batch_size,
                                 start_from="earliest" if settings.auto_offset_reset == "earliest" else "latest",
                                 idle_ms=settings.judge_idle, checks=wiring.record_checks(settings),
                                 wall_clock=settings.clock == "wall")
    processor = JudgeProcessor(KafkaSource(lambda: KafkaConsumer(**options)), store, publisher, exporter,
                               judge_options, wiring.click_judge(settings).settings)
    return processor, exporter


def run(settings: Settings) -> int:
    """`stream-ndcg judge`: serve metrics and judge until SIGTERM or Ctrl-C; exit 0."""
    processor, exporter = build(settings)
    port = exporter.serve(settings.metrics_host, settings.metrics_port, ready=processor.ready)
    logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, port)
    signal.signal(signal.SIGTERM, processor.shutdown)
    signal.signal(signal.SIGINT, processor.shutdown)
    try:
        processor.run()
    finally:
        exporter.close()
    return 0
