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
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import orjson
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from stream_ndcg import wiring
from stream_ndcg.config import Settings
from stream_ndcg.exporter import Exporter
from stream_ndcg.foreground import run_in_foreground
from stream_ndcg.judge_loop import JudgeOptions, JudgeProcessor
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.source.base import Partition
from stream_ndcg.source.kafka import KafkaSource, consumer_options, new_consumer
from stream_ndcg.source.kafka_output import KafkaOutput

logger = logging.getLogger(__name__)


class KafkaPublisher:
    """Publishes judgment events keyed by their query id, with acks from every in-sync replica and
    the idempotent producer (a retried send is not written twice).

    A judgment is a few kilobytes at most (a query id and a document id of at most `max_id_length`
    characters, and a few figures), far below the producer's `max_request_size`, but a topic whose
    `max.message.bytes` is set smaller than that refuses it: it is then dropped, logged and counted
    by `on_too_large`, not retried forever (which would stop the judge)."""

    def __init__(self, output: KafkaOutput, on_too_large: Callable[[], None]) -> None:
        self.output = output
        self.on_too_large = on_too_large

    def publish(self, partition: Partition, messages: Sequence[bytes]) -> None:
        for message in messages:
            judgment = orjson.loads(message)
            self.output.send(partition.topic, judgment["query_id"].encode(), message, partition=partition.partition,
                             on_too_large=partial(self._too_large, partition, judgment["event_id"], len(message)))
        self.output.flush()

    def _too_large(self, partition: Partition, event_id: str, size: int) -> None:
        logger.warning("judge: a judgment (event_id %s, %d bytes) is too large for %s: dropped", event_id, size,
                       partition.name)
        self.on_too_large()

    def close(self) -> None:
        self.output.close()


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
    publisher = KafkaPublisher(KafkaOutput(lambda: KafkaProducer(**producer_options), "judgments"),
                               exporter.judgments_too_large.inc)
    judge_options = JudgeOptions(topics=settings.topics, linger_ms=settings.linger, batch_size=settings.batch_size,
                                 start_from="earliest" if settings.auto_offset_reset == "earliest" else "latest",
                                 idle_ms=settings.judge_idle, checks=wiring.record_checks(settings),
                                 wall_clock=settings.clock == "wall")
    processor = JudgeProcessor(KafkaSource(lambda: new_consumer(options)), store, publisher, exporter,
                               judge_options, wiring.click_judge(settings).settings)
    return processor, exporter


def run(settings: Settings) -> int:
    """`stream-ndcg judge`: serve metrics and judge until SIGTERM or Ctrl-C; exit 0."""
    processor, exporter = build(settings)
    return run_in_foreground(processor, lambda ready: exporter.serve(settings.metrics_host, settings.metrics_port,
                                                                     ready),
                             settings.metrics_host, closing=[exporter.close])
