"""An Exporter over the in-memory store, fed the way the service feeds it: for the exporter's tests
(tests/unit) and for the check of its exposition by promtool (tests/deploy)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from stream_ndcg.engine import Engine
from stream_ndcg.events import Impression
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.metric import Measure
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.state.memory import MemoryStore
from tests.support.batches import apply_batch, parsed

T0 = 1_763_683_200_000
MINUTE = 60_000


def event(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def build(segment_labels: tuple[str, ...] = ("variant",)) -> tuple[MemoryStore, Engine, CollectorRegistry]:
    store = MemoryStore(bucket_ms=MINUTE)
    engine = Engine(Measure(cutoffs=(1, 10)), MINUTE)
    registry = CollectorRegistry()
    view = WindowView(cutoffs=(1, 10), windows_ms=(5 * MINUTE, 60 * MINUTE), bucket_ms=MINUTE,
                      segment_labels=segment_labels, event_clock=True, pipeline="search")
    Exporter(registry, store, view)
    return store, engine, registry


def feed(store: MemoryStore, engine: Engine, messages: list[bytes], projector: SegmentProjector | None = None) -> None:
    events = parsed(messages)
    if projector is not None:
        events = [projector.project(e) if isinstance(e, Impression) else e for e in events]
    apply_batch(store, engine, "t:0", events, epoch=store.claim("t:0"), next_offset=len(messages))
