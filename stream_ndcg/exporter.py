"""Every Prometheus metric of the service, owned by one class, and the HTTP endpoints.

The metric names are `vocabulary.MetricName`'s. The quality gauges and the
event counters are read from the store at scrape time, so every instance of a
consumer group reports the same numbers: the shared state in Redis is the
only truth. The operational metrics (batch time, lag, latencies, Redis round
trips) are this process's own.

    exporter = Exporter(CollectorRegistry(), store, view=WindowView.from_settings(settings))
    exporter.serve("127.0.0.1", 9464, ready=lambda: True)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stream_ndcg import __version__
from stream_ndcg.config import Settings
from stream_ndcg.core_build import core_build
from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.judge_metrics import JudgeCollector
from stream_ndcg.listener import Listener
from stream_ndcg.metrics_endpoint import serve_metrics
from stream_ndcg.query_figures import PeriodicQueryFigures
from stream_ndcg.setting_values import format_duration
from stream_ndcg.state.base import StateStore
from stream_ndcg.state.cache import CacheFigures
from stream_ndcg.vocabulary import (
    DEDUPLICATED_TYPES,
    EVENT_TYPES,
    UNLISTED_SOURCE,
    MetricName,
    duplicate,
    judgment_source,
    rejection_reason,
)
from stream_ndcg.window_sums import WindowSums
from stream_ndcg.windows import means, window_buckets

logger = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400)


@dataclass(frozen=True)
class WindowView:
    """How scrapes turn bucket sums into window means."""

    cutoffs: tuple[int, ...]
    windows_ms: tuple[int, ...]
    bucket_ms: int
    segment_labels: tuple[str, ...]
    event_clock: bool
    # The key namespace: two pipelines scraped by one Prometheus stay apart by it.
    pipeline: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> WindowView:
        """The view of the state the settings build: its cut-offs are those of the engine's `Settings.measure`."""
        return cls(cutoffs=settings.measure.cutoffs, windows_ms=settings.windows, bucket_ms=settings.bucket,
                   segment_labels=settings.segment_labels, event_clock=settings.clock == "event",
                   pipeline=settings.key_namespace)

    def window_buckets(self, now_ms: int, window_ms: int) -> tuple[int, int]:
        """`windows.window_buckets` with this view's buckets."""
        return window_buckets(now_ms, window_ms, self.bucket_ms)

    def now_ms(self, store: StateStore, clock: Callable[[], float]) -> int | None:
        """Where the windows end: the state's event clock (None before any event), or the wall clock."""
        return store.clock_ms() if self.event_clock else int(clock() * 1000)


class WindowTotals:
    """Each window's totals per segment values, kept up to date from a store by reading only the
    buckets that changed since the last call (`window_sums.WindowSums`). The exporter's gauges and
    the drill-down's summary are read from one of these."""

    def __init__(self, store: StateStore, view: WindowView) -> None:
        self.store = store
        self.view = view
        self.sums = WindowSums(view.windows_ms, view.segment_labels)
        self._lock = threading.Lock()

    def at(self, now_ms: int) -> dict[int, dict[tuple[str, ...], dict[str, float]]]:
        """Per window ending at `now_ms`, its totals per segment values."""
        view = self.view
        ranges = {window: view.window_buckets(now_ms, window) for window in view.windows_ms}
        oldest = min(first for first, _ in ranges.values())
        # One call at a time moves the sums: the HTTP servers answer each request in a thread.
        with self._lock:
            self.sums.apply(self.store.read_aggregates(self.sums.marks(oldest), oldest), oldest)
            self.sums.slide(ranges)
            return {window: self.sums.totals(window) for window in view.windows_ms}


# The exporter's warm-up reads again while a read takes longer than this, at most this many times.
CAUGHT_UP_S = 0.1
WARM_UP_READS = 5


class _StateCacheCollector(Collector):
    """The consumer's state cache (`state.cache`), read at each scrape."""

    def __init__(self, figures: Callable[[], CacheFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        now = self.figures()
        lookups = CounterMetricFamily(MetricName.STATE_CACHE_LOOKUPS, "Query states a batch asked the state cache "
                                      "for: hit, found there; miss, read back from Redis (or new).", labels=["result"])
        lookups.add_metric(["hit"], now.hits)
        lookups.add_metric(["miss"], now.misses)
        yield lookups
        yield CounterMetricFamily(MetricName.STATE_CACHE_EVICTIONS, "Query states dropped from the state cache to "
                                  "keep within state_cache_groups or state_cache_mib.", value=now.evictions)
        yield GaugeMetricFamily(MetricName.STATE_CACHE_STATES, "Query states in the state cache.", value=now.states)
        yield GaugeMetricFamily(MetricName.STATE_CACHE_BYTES, "The state cache's estimated size, which "
                                "state_cache_mib bounds.", value=now.estimated_bytes)


class _StoreCollector(Collector):
    def __init__(self, store: StateStore, view: WindowView, clock: Callable[[], float],
                 on_error: Callable[[], None]) -> None:
        self.store = store
        self.view = view
        self.clock = clock
        self.on_error = on_error
        self.totals = WindowTotals(store, view)
        # The drill-down's figures over queries, where it keeps per-query rows (`Exporter.export_query_figures`).
        self.query_figures: PeriodicQueryFigures | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def warm_up(self) -> None:
        """The first read of every partition's buckets, before the first scrape asks (with a day of
        minutes and 64 partitions it takes seconds, and a scrape times out after 10 by default),
        then reads of what changed meanwhile until one is quick, so that the first scrape reads
        what a scrape usually reads."""
        started = time.monotonic()
        try:
            for _ in range(WARM_UP_READS):
                read_started = time.monotonic()
                now = self.view.now_ms(self.store, self.clock)
                if now is None:
                    return
                self.totals.at(now)
                if time.monotonic() - read_started < CAUGHT_UP_S:
                    break
        except StoreUnavailable as exc:
            logger.info("window sums not read ahead of the first scrape (it will read them): %s", exc)
            return
        logger.info("window sums read ahead of the first scrape in %.1f s", time.monotonic() - started)

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except StoreUnavailable as exc:
            self.on_error()
            logger.warning("scrape could not read the store: %s", exc)

    def _collect(self) -> Iterator[Metric]:
        view = self.view
        seg = list(view.segment_labels)
        counts = self.store.counts()
        pipeline = [view.pipeline]
        events = CounterMetricFamily(MetricName.EVENTS, "Events accepted, by type.", labels=["pipeline", "type"])
        rejected = CounterMetricFamily(MetricName.EVENTS_REJECTED, "Events rejected, by reason.",
                                       labels=["pipeline", "reason"])
        duplicates = CounterMetricFamily(MetricName.EVENTS_DUPLICATE,
                                         "Events delivered again and ignored, by type.", labels=["pipeline", "type"])
        for kind in EVENT_TYPES:
            events.add_metric([*pipeline, kind], counts.get(kind, 0))
        for kind in DEDUPLICATED_TYPES:
            duplicates.add_metric([*pipeline, kind], counts.get(duplicate(kind), 0))
        judgments = CounterMetricFamily(MetricName.JUDGMENTS, "Judgment events applied, by source (judgment_sources).",
                                        labels=["pipeline", "source"])
        unlisted = CounterMetricFamily(MetricName.JUDGMENTS_UNLISTED,
                                       "Judgment events of a source judgment_sources does not list: counted, "
                                       "never applied.", labels=["pipeline"])
        unlisted.add_metric(pipeline, counts.get(UNLISTED_SOURCE, 0))
        for name, n in sorted(counts.items()):
            reason = rejection_reason(name)
            if reason is not None:
                rejected.add_metric([*pipeline, reason], n)
            source = judgment_source(name)
            if source is not None:
                judgments.add_metric([*pipeline, source], n)
        yield from (events, rejected, duplicates, judgments, unlisted)

        now = view.now_ms(self.store, self.clock)
        labels = ["pipeline", "k", "window", *seg]
        gauges = [(GaugeMetricFamily(name, text, labels=labels), field) for name, text, field in _QUALITY_GAUGES]
        by_query = [(GaugeMetricFamily(name, text, labels=labels), field) for name, text, field in _QUERY_GAUGES]
        impressions = GaugeMetricFamily(MetricName.IMPRESSIONS, "Impressions in the window.",
                                        labels=["pipeline", "window", *seg])
        squared = GaugeMetricFamily(MetricName.SQUARED_IMPRESSIONS,
                                    "Impressions of the window whose squares the sums of squares hold (all of "
                                    "them, but after an upgrade from state format 4).",
                                    labels=["pipeline", "window", *seg])
        as_of = GaugeMetricFamily(MetricName.QUERY_FIGURES_TIMESTAMP, "When the figures over queries (clustered "
                                  "errors, query-averaged means, queries) were last brought up to date, Unix "
                                  "seconds: they are served from that computation until the next.",
                                  labels=["pipeline"])
        if now is not None:
            totals = self.totals.at(now)
            queries = None
            if self.query_figures is not None:
                computed = self.query_figures.latest(now, {window: list(totals[window]) for window in view.windows_ms})
                queries = computed.figures
                as_of.add_metric(pipeline, computed.at_s)
            for window in view.windows_ms:
                name = format_duration(window)
                for label_values, sums in sorted(totals[window].items()):
                    rows = means(sums, view.cutoffs)
                    first = rows[str(view.cutoffs[0])]
                    impressions.add_metric([*pipeline, name, *label_values], _number(first["impressions"]))
                    squared.add_metric([*pipeline, name, *label_values], _number(first["squared_impressions"]))
                    over_queries = None if queries is None else queries[window][label_values]
                    for i, k in enumerate(view.cutoffs):
                        row, values = rows[str(k)], [*pipeline, str(k), name, *label_values]
                        for family, field in gauges:
                            family.add_metric(values, _number(row[field]))
                        if over_queries is not None:
                            for family, field in by_query:
                                family.add_metric(values, _number(over_queries[i][field]))
        yield from (family for family, _ in gauges)
        if self.query_figures is not None:
            yield from (family for family, _ in by_query)
            yield as_of
        yield impressions
        yield squared


# The quality gauges of each k: name, help, and the field of `windows.means` they report.
_QUALITY_GAUGES = (
    (MetricName.NDCG, "Mean nDCG@k over the scored impressions of the window.", "ndcg_mean"),
    (MetricName.NDCG_NUMERATOR, "Sum of nDCG@k over the scored impressions of the window.", "ndcg_sum"),
    (MetricName.SCORED_IMPRESSIONS, "Impressions of the window whose nDCG@k is defined (ideal DCG > 0).",
     "scored_impressions"),
    (MetricName.DCG, "Mean DCG@k over all impressions of the window.", "dcg_mean"),
    (MetricName.DCG_NUMERATOR, "Sum of DCG@k over all impressions of the window.", "dcg_sum"),
    (MetricName.JUDGED_RATIO, "Mean share of the top k ranks holding a judged document.", "judged_ratio"),
    (MetricName.JUDGED_RATIO_NUMERATOR, "Sum of the judged ratio@k over all impressions of the window.",
     "judged_sum"),
    (MetricName.NDCG_SQUARES, "Sum of squares of nDCG@k over the scored impressions of the window.",
     "ndcg_squares"),
    (MetricName.DCG_SQUARES, "Sum of squares of DCG@k over all impressions of the window.", "dcg_squares"),
    (MetricName.NDCG_STANDARD_ERROR, "Impression-level standard error of the mean nDCG@k.", "ndcg_standard_error"),
    (MetricName.DCG_STANDARD_ERROR, "Impression-level standard error of the mean DCG@k.", "dcg_standard_error"),
)
# From the drill-down's per-query sums (`drilldown.index.QueryIndex.over_queries`).
_QUERY_GAUGES = (
    (MetricName.NDCG_CLUSTERED_STANDARD_ERROR, "Query-clustered standard error of the mean nDCG@k.",
     "ndcg_clustered_standard_error"),
    (MetricName.DCG_CLUSTERED_STANDARD_ERROR, "Query-clustered standard error of the mean DCG@k.",
     "dcg_clustered_standard_error"),
    (MetricName.NDCG_QUERY_MEAN, "Mean over the window's queries of each query's mean nDCG@k (each query once).",
     "ndcg_query_mean"),
    (MetricName.QUERIES, "Queries with impressions in the window.", "queries"),
)


def _number(value: float | None) -> float:
    """A mean with nothing to average is NaN in Prometheus."""
    return math.nan if value is None else value


class Exporter:
    """Owns every metric of stream-ndcg; the registry is injected (a fresh one in tests)."""

    def __init__(self, registry: CollectorRegistry, store: StateStore | None, view: WindowView | None,
                 clock: Callable[[], float] = time.time, revision: str = "unknown", *,
                 judge: JudgeCollector | None = None, state_cache: Callable[[], CacheFigures] | None = None) -> None:
        """`run`'s exporter reads `store` through `view`, and its consumer's state cache through
        `state_cache`; `judge`'s has neither, and reads its own state through `judge` instead."""
        self.registry = registry
        # The process (CPU, memory, file descriptors), Python version and garbage collector
        # metrics that the default registry would carry, so a fresh registry loses nothing.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        Info(MetricName.BUILD, "The version and source revision of the running service, and the build of its "
             "pure core (compiled by mypyc, or pure Python).",
             registry=registry).info({"version": __version__, "revision": revision, "core": core_build().core})
        self.batch_seconds = Histogram(MetricName.BATCH_DURATION,
                                       "Time to process one batch: parse, load, apply, commit.", registry=registry)
        self.batch_events = Histogram(MetricName.BATCH_EVENTS, "Records in one batch.",
                                      buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000), registry=registry)
        self.judgment_latency = Histogram(
            MetricName.JUDGMENT_LATENCY,
            "From a judgment's event time to the commit that makes it visible in the metrics.",
            buckets=_LATENCY_BUCKETS, registry=registry)
        self.redis_seconds = Histogram(MetricName.REDIS_ROUND_TRIP, "Duration of one Redis round trip.",
                                       buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
                                       registry=registry)
        self.consumer_lag = Gauge(
            MetricName.CONSUMER_LAG,
            "Offsets behind the last stable offset of each assigned partition (0 once all that is committed is read).",
            ["topic", "partition"], registry=registry)
        self.consumer_held_back = Gauge(
            MetricName.CONSUMER_HELD_BACK,
            "Offsets past the last stable offset: behind a transaction still open, not readable yet.",
            ["topic", "partition"], registry=registry)
        self.assigned_partitions = Gauge(MetricName.ASSIGNED_PARTITIONS,
                                         "Input partitions this instance holds.", registry=registry)
        self.backoffs = Counter(MetricName.BACKOFFS, "Times the service backed off after a transient fault, by cause.",
                                ["cause"], registry=registry)
        self.offsets_skipped = Counter(
            MetricName.OFFSETS_SKIPPED,
            "Offsets deleted from Kafka (retention or delete-records) before they were read: events never counted.",
            ["topic", "partition"], registry=registry)
        self.fenced = Counter(MetricName.FENCED_BATCHES, "Batches refused because another instance took a partition.",
                              registry=registry)
        self.dead_letters_dropped = Counter(MetricName.DEAD_LETTERS_DROPPED,
                                            "Rejected messages too large for the dead-letter producer.",
                                            registry=registry)
        self.scrape_errors = Counter(MetricName.SCRAPE_ERRORS, "Scrapes that could not read the shared state.",
                                     registry=registry)
        self.ready = Gauge(MetricName.READY, "1 while the service consumes and commits normally.", registry=registry)
        self._collector: _StoreCollector | None = None
        # What the gauges are read from, for the drill-down's summary to read the same numbers.
        self.window_totals: WindowTotals | None = None
        if store is not None and view is not None:
            self._collector = _StoreCollector(store, view, clock, self.scrape_errors.inc)
            registry.register(self._collector)
            self.window_totals = self._collector.totals
        if state_cache is not None:
            registry.register(_StateCacheCollector(state_cache))
        if judge is not None:
            judge.on_error = self.scrape_errors.inc
            registry.register(judge)
        # Exported by `judge` only.
        self.judgments_published = Counter(MetricName.JUDGMENTS_PUBLISHED, "Judgment events judge published (again "
                                           "after a crash: run counts those as duplicates).",
                                           registry=registry if judge is not None else None)
        self.judgments_too_large = Counter(MetricName.JUDGMENTS_TOO_LARGE, "Judgment events the brokers refused "
                                           "for their size: dropped, not retried (in judgments_published too).",
                                           registry=registry if judge is not None else None)
        self._listener: Listener | None = None

    def serve(self, host: str, port: int, ready: Callable[[], bool]) -> int:
        """Serve /metrics, /healthz and /readyz in a daemon thread; return the bound port."""
        self._listener = serve_metrics(self.registry, host, port, ready)
        if self._collector is not None and self._collector.query_figures is not None:
            self._collector.query_figures.start()
        threading.Thread(target=self.warm_up, name="window-sums-warm-up", daemon=True).start()
        return self._listener.port

    def export_query_figures(self, figures: PeriodicQueryFigures) -> None:
        """Export the clustered standard errors, query-averaged means and query counts of
        `figures` (the drill-down's `Explorer.figures`: with drilldown = false there is none), which
        `serve` then brings up to date in a thread of their own, every interval, until `close`."""
        if self._collector is not None:
            self._collector.query_figures = figures

    def warm_up(self) -> None:
        """Read the window sums ahead of the first scrape (`serve` starts it in a thread)."""
        if self._collector is not None:
            self._collector.warm_up()

    def close(self) -> None:
        if self._collector is not None and self._collector.query_figures is not None:
            self._collector.query_figures.stop()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
