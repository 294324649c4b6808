"""`stream-ndcg ubi-bridge`: UBI queries and events from Kafka in, the contract's impressions and
clicks out, keyed by the query text (the join itself is `ubi`'s, pure).

Both UBI topics are keyed by UBI `query_id` and have as many partitions, so a search and its events
share a partition number; Kafka's range assignor, the one this consumer uses, gives the same
numbers of both topics to the same member. Each partition number is a lane with a `UbiJoin` of its
own. Every batch goes:

1. poll; a lane whose partitions were taken away (or given back) is dropped, and its partitions
   still held are read again from their committed offsets, which rebuilds what it held;
2. join each record in its lane; send the events to the output topic (acks=all, idempotent);
3. flush, and only once every event is acknowledged, commit per partition the least offset its
   lane still holds (a search its clicks may still come for, a waiting click), or past the batch.

An event the output topic refuses for its size (at send, by the producer's `max_request_size`; at
the flush, by the topic's `max.message.bytes`) is not retried: it is counted as skipped,
`too_large`, logged with its UBI query_id and size, and the batch is committed past it as past a
UBI document skipped.

So a crash, a restart or a rebalance reads again what was held and sends its events again, with
the same event ids: at least once, never lost, and a repeat is a duplicate downstream (`run` drops
an impression id seen within `dedup_horizon`; a click counts once per impression and document).
Any fault closes the consumer, drops every lane and starts over from the committed offsets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.coordinator.assignors.range import RangePartitionAssignor
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from stream_ndcg.backoff import Backoff
from stream_ndcg.config import Settings
from stream_ndcg.errors import BrokerUnavailable, RecoverableError
from stream_ndcg.events import Click, Impression, Limits
from stream_ndcg.foreground import run_in_foreground
from stream_ndcg.metrics_endpoint import serve_metrics
from stream_ndcg.source.base import Partition, Source, StartFrom
from stream_ndcg.source.kafka import KafkaSource, consumer_options, new_consumer
from stream_ndcg.source.kafka_output import KafkaOutput
from stream_ndcg.ubi import CLICK_OUTCOMES, SKIP_REASONS, UbiCounts, UbiJoin, UbiOptions, contract_message
from stream_ndcg.vocabulary import MetricName

logger = logging.getLogger(__name__)


class Sink(Protocol):
    """Where the bridge's events go: `send` queues one, `flush` returns once every one queued is
    acknowledged or refused for its size (`on_too_large` called: at `send` or at `flush`), or raises
    BrokerUnavailable."""

    def send(self, key: bytes, value: bytes, on_too_large: Callable[[], None]) -> None: ...

    def flush(self) -> None: ...


class KafkaSink:
    """The output topic through an idempotent producer that waits for every in-sync replica."""

    def __init__(self, output: KafkaOutput, topic: str) -> None:
        self.output = output
        self.topic = topic

    def send(self, key: bytes, value: bytes, on_too_large: Callable[[], None]) -> None:
        self.output.send(self.topic, key, value, on_too_large=on_too_large)

    def flush(self) -> None:
        self.output.flush()

    def close(self) -> None:
        self.output.close()


@dataclass(frozen=True)
class BridgeOptions:
    queries_topic: str
    events_topic: str
    linger_ms: int
    batch_size: int
    start_from: StartFrom
    join: UbiOptions


class BridgeMetrics(Collector):
    """The bridge's metrics, read from its `UbiCounts` at scrape time: documents read by kind, skipped
    by reason, clicks by outcome (joined, unjoined, too_late), impressions written; with its backoffs and
    readiness. (Not `Exporter`'s: that one reads `run`'s state in Redis, which the bridge has none of.)"""

    def __init__(self, registry: CollectorRegistry, counts: UbiCounts) -> None:
        self.counts = counts
        self.backoffs = Counter(MetricName.BACKOFFS, "Times the service backed off after a transient fault, by cause.",
                                ["cause"], registry=registry)
        self.ready = Gauge(MetricName.READY, "1 while the service consumes and commits normally.", registry=registry)
        registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> Iterator[Metric]:
        counts = self.counts
        read = CounterMetricFamily(MetricName.UBI_DOCUMENTS, "UBI documents read, by topic kind (query or event); "
                                   "reads again after a restart or rebalance included.", labels=["kind"])
        for kind in ("query", "event"):
            read.add_metric([kind], counts.read[kind])
        skipped = CounterMetricFamily(MetricName.UBI_SKIPPED, "UBI documents (or shown results) that became no "
                                      "event, by reason.", labels=["reason"])
        for reason in SKIP_REASONS:
            skipped.add_metric([reason], counts.skipped[reason])
        clicks = CounterMetricFamily(MetricName.UBI_CLICKS, "UBI clicks: joined to their search and written, "
                                     "unjoined (no search within ubi_click_wait), too_late (after ubi_search_ttl).",
                                     labels=["outcome"])
        for outcome in CLICK_OUTCOMES:
            clicks.add_metric([outcome], counts.clicks[outcome])
        impressions = CounterMetricFamily(MetricName.UBI_IMPRESSIONS, "Impressions sent, one per UBI search "
                                          "(those refused for their size are skipped too_large too).")
        impressions.add_metric([], counts.impressions)
        yield from (read, skipped, clicks, impressions)


class UbiBridge:
    """The consumer loop of the bridge (see the module docstring); `run` until `shutdown`."""

    def __init__(self, source: Source, sink: Sink, options: BridgeOptions, metrics: BridgeMetrics) -> None:
        self.source = source
        self.sink = sink
        self.options = options
        self.metrics = metrics
        self.backoff = Backoff()
        self._shutdown = threading.Event()
        self._subscribed = False
        self._ready = False
        self._lanes: dict[int, UbiJoin] = {}
        # The partitions sought to their committed offsets since their lane was last dropped; the
        # offsets committed (or found committed) of each, and the next offset of those read.
        self._started: set[Partition] = set()
        self._committed: dict[Partition, int] = {}
        self._next: dict[Partition, int] = {}

    @property
    def topics(self) -> tuple[str, str]:
        return self.options.queries_topic, self.options.events_topic

    def shutdown(self, *_: Any) -> None:
        self._shutdown.set()

    def ready(self) -> bool:
        return self._ready

    def run(self) -> None:
        while not self._shutdown.is_set():
            try:
                self.run_once()
                self.backoff.reset()
            except RecoverableError as exc:
                self._fault(exc)
        self._close()

    def run_once(self) -> None:
        """One batch: poll, join, send, flush, commit."""
        if not self._subscribed:
            self._subscribe()
        batch = self.source.poll(self.options.linger_ms, self.options.batch_size)
        self._rebalanced(batch)
        for partition, records in batch.items():
            lane = self._lanes.setdefault(partition.partition, UbiJoin(self.options.join, self.metrics.counts))
            add = lane.add_query if partition.topic == self.options.queries_topic else lane.add_event
            for record in records:
                for event in add(record.value, record.offset):
                    key, value = contract_message(event)
                    self.sink.send(key, value, partial(self._too_large, event, len(key) + len(value)))
            self._next[partition] = records[-1].offset + 1
        self.sink.flush()
        commits: dict[Partition, int] = {}
        for number, lane in self._lanes.items():
            for topic, held in zip(self.topics, lane.low_water(), strict=True):
                partition = Partition(topic, number)
                if partition in self._next:
                    offset = self._next[partition] if held is None else held
                    if offset != self._committed.get(partition):
                        commits[partition] = offset
        self.source.commit(commits)
        self._committed.update(commits)
        self._ready = True
        self.metrics.ready.set(1)

    def _subscribe(self) -> None:
        self.source.open()
        missing = self.source.missing_topics(self.topics)
        if missing:
            self.source.close()
            raise BrokerUnavailable(f"topic(s) {', '.join(missing)} do not exist (yet)")
        self.source.subscribe(self.topics)
        self._subscribed = True

    def _rebalanced(self, batch: dict[Partition, Any]) -> None:
        """Drop the lanes of partitions taken away or given back since the last poll, and the batch's
        records of them; partitions held and not started yet read from their committed offsets."""
        assigned = self.source.assignment()
        lost = {p.partition for p in self.source.revoked()}
        lost |= {n for n in self._lanes if any(Partition(t, n) not in assigned for t in self.topics)}
        for number in lost:
            self._lanes.pop(number, None)
            for topic in self.topics:
                partition = Partition(topic, number)
                batch.pop(partition, None)
                self._started.discard(partition)
                self._next.pop(partition, None)
                self._committed.pop(partition, None)
        for partition in sorted(assigned - self._started):
            offset = self.source.committed_offset(partition)
            self.source.seek(partition, offset, self.options.start_from)
            batch.pop(partition, None)
            self._started.add(partition)
            if offset is not None:
                self._committed[partition] = offset

    def _too_large(self, event: Impression | Click, size: int) -> None:
        """An event the output topic refused for its size: bad input, not an outage, so it is counted
        and logged (never its content) instead of retried forever."""
        self.metrics.counts.skipped["too_large"] += 1
        logger.warning("ubi-bridge: the %s of UBI query_id %r (%d bytes) is too large for the output topic: "
                       "skipped (too_large)", type(event).__name__.lower(), event.impression_id, size)

    def _fault(self, exc: RecoverableError) -> None:
        logger.warning("ubi-bridge: %s; starting again from the committed offsets", exc)
        self.metrics.backoffs.labels(cause=type(exc).__name__).inc()
        self._close()
        self._shutdown.wait(self.backoff.next_delay())

    def _close(self) -> None:
        self._ready = False
        self.metrics.ready.set(0)
        self._lanes.clear()
        self._started.clear()
        self._committed.clear()
        self._next.clear()
        if self._subscribed:
            self._subscribed = False
            self.source.close()


def build(settings: Settings, registry: CollectorRegistry | None = None,
          counts: UbiCounts | None = None) -> tuple[UbiBridge, BridgeMetrics, KafkaSink]:
    """The bridge of the settings: its consumer group (read-committed, range assignor), its idempotent
    producer, its join bounds and its metrics."""
    counts = counts if counts is not None else UbiCounts()
    metrics = BridgeMetrics(registry or CollectorRegistry(), counts)
    kafka_options = settings.kafka_client_options()
    options = consumer_options(kafka_options, group_id=settings.ubi_group_id,
                               auto_offset_reset=settings.auto_offset_reset, batch_size=settings.batch_size,
                               max_message_bytes=settings.max_message_bytes)
    # A search and its events share a partition number; the range assignor gives a member the same
    # numbers of both topics (round robin would split them).
    options["partition_assignment_strategy"] = (RangePartitionAssignor,)
    output = KafkaOutput(lambda: KafkaProducer(**kafka_options, acks="all", enable_idempotence=True, linger_ms=5),
                         f"output topic {settings.ubi_output_topic}")
    sink = KafkaSink(output, settings.ubi_output_topic)
    join = UbiOptions(click_wait_ms=settings.ubi_click_wait, search_ttl_ms=settings.ubi_search_ttl,
                      impression_wait_ms=settings.ubi_impression_wait,
                      excluded_clients=settings.ubi_excluded_clients,
                      limits=Limits(max_results=settings.max_results))
    bridge = UbiBridge(KafkaSource(lambda: new_consumer(options)), sink,
                       BridgeOptions(settings.ubi_queries_topic, settings.ubi_events_topic, settings.linger,
                                     settings.batch_size,
                                     "earliest" if settings.auto_offset_reset == "earliest" else "latest", join),
                       metrics)
    return bridge, metrics, sink


def run(settings: Settings) -> int:
    """`stream-ndcg ubi-bridge`: serve its metrics and bridge until SIGTERM or Ctrl-C; exit 0."""
    registry = CollectorRegistry()
    bridge, _, sink = build(settings, registry)
    logger.info("ubi-bridge: %s and %s to %s", settings.ubi_queries_topic, settings.ubi_events_topic,
                settings.ubi_output_topic)
    listener = serve_metrics(registry, settings.metrics_host, settings.metrics_port, bridge.ready)
    return run_in_foreground(bridge, lambda ready: listener.port, settings.metrics_host,
                             closing=[sink.close, listener.close])
