"""The exporter's metrics, read from a fresh registry over the in-memory store."""

from __future__ import annotations

import math
from typing import Any
from urllib.request import urlopen

from prometheus_client import CollectorRegistry, generate_latest

from stream_ndcg import __version__
from stream_ndcg.core_build import core_build
from stream_ndcg.exporter import Exporter, WindowView
from stream_ndcg.query_state import QueryState
from stream_ndcg.segments import SegmentProjector
from stream_ndcg.state.cache import StateCache, estimated_bytes
from stream_ndcg.state.memory import MemoryStore
from tests.support.exporter import MINUTE, T0, build, event, feed


def test_window_gauges_and_counters() -> None:
    store, engine, registry = build()
    feed(store, engine, [
        event(type="impression", impression_id="old", query_id="q", ts=T0, results=["a"], segment={"variant": "A"}),
        event(type="impression", impression_id="new", query_id="q", ts=T0 + 30 * MINUTE, results=["b", "a"],
              segment={"variant": "A"}),
        event(type="judgment", query_id="q", doc_id="a", grade=1, ts=T0 + 30 * MINUTE),
        event(type="click", impression_id="new", query_id="q", doc_id="a", ts=T0 + 30 * MINUTE),
        b"oops",
    ])

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"pipeline": "search", **labels})

    assert get("stream_ndcg_impressions", window="1h", variant="A") == 2
    assert get("stream_ndcg_impressions", window="5m", variant="A") == 1
    assert get("stream_ndcg_ndcg", k="10", window="1h", variant="A") == (1 + 1 / math.log2(3)) / 2
    assert get("stream_ndcg_ndcg_numerator", k="10", window="5m", variant="A") == 1 / math.log2(3)
    assert get("stream_ndcg_scored_impressions", k="1", window="1h", variant="A") == 2
    assert get("stream_ndcg_judged_ratio", k="1", window="1h", variant="A") == 0.5
    assert get("stream_ndcg_dcg", k="1", window="5m", variant="A") == 0.0
    assert get("stream_ndcg_dcg_numerator", k="10", window="1h", variant="A") == 1 + 1 / math.log2(3)
    assert get("stream_ndcg_judged_ratio_numerator", k="10", window="1h", variant="A") == 0.2
    assert get("stream_ndcg_events_total", type="impression") == 2
    assert get("stream_ndcg_events_total", type="judgment") == 1
    # Counted, never applied nor rejected: `run` leaves clicks to the click models.
    assert get("stream_ndcg_events_total", type="click") == 1
    assert get("stream_ndcg_events_duplicate_total", type="click") is None
    assert get("stream_ndcg_events_rejected_total", reason="not_json") == 1
    assert get("stream_ndcg_events_duplicate_total", type="impression") == 0


def test_segment_values_past_the_cap_become_other_and_missing_ones_none() -> None:
    store, engine, registry = build(("variant", "engine"))
    projector = SegmentProjector(store, ("variant", "engine"), cap=2)
    feed(store, engine, [
        event(type="impression", impression_id=f"i{v}", query_id="q", ts=T0, results=["a"],
              segment={"variant": v, "locale": "de"}) for v in ("A", "B", "C", "D")
    ], projector)
    values = {(s.labels["variant"], s.labels["engine"]) for metric in registry.collect() for s in metric.samples
              if s.name == "stream_ndcg_impressions"}
    assert values == {("A", "none"), ("B", "none"), ("other", "none")}
    assert registry.get_sample_value("stream_ndcg_impressions", {"pipeline": "search", "window": "5m",
                                                                  "variant": "other", "engine": "none"}) == 2


def test_http_endpoints() -> None:
    store = MemoryStore()
    registry = CollectorRegistry()
    exporter = Exporter(registry, store, WindowView((10,), (MINUTE,), MINUTE, (), False))
    port = exporter.serve("127.0.0.1", 0, ready=lambda: False)
    try:
        body = urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()  # noqa: S310
        assert "stream_ndcg_batch_duration_seconds" in body
        assert urlopen(f"http://127.0.0.1:{port}/healthz").status == 200  # noqa: S310
        try:
            urlopen(f"http://127.0.0.1:{port}/readyz")  # noqa: S310
            raise AssertionError("readyz answered 200 while not ready")
        except OSError as exc:
            assert "503" in str(exc)
    finally:
        exporter.close()


def test_build_info_and_the_process_and_runtime_metrics_are_exported() -> None:
    registry = CollectorRegistry()
    Exporter(registry, MemoryStore(), WindowView((10,), (MINUTE,), MINUTE, (), False), revision="abc123")
    assert registry.get_sample_value("stream_ndcg_build_info", {"version": __version__, "revision": "abc123",
                                                                "core": core_build().core}) == 1
    assert registry.get_sample_value("process_resident_memory_bytes")
    names = {metric.name for metric in registry.collect()}
    assert {"python_info", "python_gc_objects_collected"} <= names


def test_the_warm_up_reads_the_buckets_so_that_a_scrape_reads_only_what_changed_since() -> None:
    store, engine, _ = build()
    feed(store, engine, [
        event(type="impression", impression_id=f"i{n}", query_id="q", ts=T0 + n * MINUTE, results=["a", "b"],
              segment={"variant": "A"}) for n in range(30)
    ])
    reads = store.read_aggregates
    values_read: list[int] = []

    def counted(marks: Any, since_bucket: int) -> Any:
        got = list(reads(marks, since_bucket))
        values_read.append(sum(len(sums) for read in got for sums in read.buckets.values()))
        return got

    store.read_aggregates = counted  # type: ignore[method-assign]
    registry = CollectorRegistry()
    view = WindowView(cutoffs=(1, 10), windows_ms=(5 * MINUTE, 60 * MINUTE), bucket_ms=MINUTE,
                      segment_labels=("variant",), event_clock=True, pipeline="search")
    exporter = Exporter(registry, store, view)
    exporter.warm_up()
    assert values_read and values_read[0] > 0
    warmed = len(values_read)
    scraped = generate_latest(registry)
    assert values_read[warmed:] == [0]
    assert registry.get_sample_value("stream_ndcg_impressions", {"pipeline": "search", "window": "1h",
                                                                 "variant": "A"}) == 30
    fresh = CollectorRegistry()
    Exporter(fresh, store, view)

    def quality(scrape: bytes) -> list[bytes]:
        return [line for line in scrape.splitlines()
                if line.startswith(b"stream_ndcg_") and b"_created" not in line and b"duration" not in line]

    assert quality(generate_latest(fresh)) == quality(scraped)


def test_the_state_cache_is_exported_as_its_figures_read_at_each_scrape() -> None:
    registry = CollectorRegistry()
    cache = StateCache(most_groups=2, most_bytes=2**40)
    Exporter(registry, MemoryStore(), WindowView((10,), (MINUTE,), MINUTE, (), False), state_cache=cache.figures)
    cache.put("t:0", {"a": QueryState(), "b": QueryState()}, deadline=100.0)
    cache.get("t:0", "b", now=1.0)
    cache.get("t:0", "missing", now=1.0)
    cache.put("t:0", {"c": QueryState(), "d": QueryState()}, deadline=100.0)  # a group each: a and b go

    def get(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert get("stream_ndcg_state_cache_lookups_total", result="hit") == 1
    assert get("stream_ndcg_state_cache_lookups_total", result="miss") == 1
    assert get("stream_ndcg_state_cache_evictions_total") == 2
    assert get("stream_ndcg_state_cache_states") == 2
    assert get("stream_ndcg_state_cache_estimated_bytes") == 2 * estimated_bytes(QueryState())
