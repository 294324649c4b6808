"""The history's checks: its OpenMetrics text read back, and what the service reports after a prefix of the events."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from stream_ndcg.config import Settings
from stream_ndcg.engine import Engine
from stream_ndcg.events import Limits
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.offline.history import WINDOW_GAUGES
from stream_ndcg.pipeline import BatchPipeline, PartitionBatch, RecordChecks
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.source.local import LocalRecord
from stream_ndcg.state.memory import MemoryStore

Labels = tuple[tuple[str, str], ...]
# (metric, labels sorted by name, time in ms) -> value.
TimedSamples = dict[tuple[str, Labels, int], float]


def read_openmetrics(text: str) -> TimedSamples:
    """Every sample of an OpenMetrics text, read by prometheus_client's parser (which refuses what
    the format forbids: a series split in two runs, time going back, no `# EOF`)."""
    samples: TimedSamples = {}
    # prometheus_client's OpenMetrics parser has no annotations.
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        assert family.type == "gauge", family
        for sample in family.samples:
            assert sample.timestamp is not None, sample
            ms = sample.timestamp.sec * 1000 + sample.timestamp.nsec // 1_000_000
            samples[(sample.name, tuple(sorted(sample.labels.items())), ms)] = sample.value
    return samples


def service_gauges(messages: Sequence[tuple[bytes, bytes]], settings: Settings,
                   batch: int = 500) -> dict[tuple[str, Labels], float]:
    """The window gauges a service with these settings (the event clock) reports once it has
    consumed the keyed messages from one partition in batches of `batch`: wired as
    `service.build` wires it, over the in-memory store."""
    store = MemoryStore(bucket_ms=settings.bucket, horizon_ms=settings.horizon,
                        dedup_horizon_ms=settings.dedup_horizon)
    engine = Engine(settings.measure, settings.bucket, horizon_ms=settings.horizon,
                    judgment_max_age_ms=settings.judgment_ttl, dedup_horizon_ms=settings.dedup_horizon)
    checks = RecordChecks(Limits(max_results=settings.max_results, max_message_bytes=settings.max_message_bytes),
                          require_key=settings.require_key, max_future_ms=settings.max_future)
    pipeline = BatchPipeline(store, engine, checks, event_clock=True,
                             projector=SegmentProjector(store, settings.segment_labels, settings.segment_cap))
    registry = CollectorRegistry()
    Exporter(registry, store, WindowView.from_settings(settings))
    epoch = store.claim("events:0")
    expected: int | None = None
    for start in range(0, len(messages), batch):
        records = [LocalRecord("events", 0, start + i, key, value)
                   for i, (key, value) in enumerate(messages[start:start + batch])]
        pipeline.run([PartitionBatch("events:0", epoch, records, expected)], now_ms=int(time.time() * 1000))
        expected = start + len(records)
    return {(family.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect() if family.name in WINDOW_GAUGES for sample in family.samples}
