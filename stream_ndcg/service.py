"""Wiring: builds the store, engine, exporter and processor from settings, and runs them."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
from collections.abc import Callable

from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from stream_ndcg import __version__, wiring
from stream_ndcg.config import Settings
from stream_ndcg.consumer import StreamProcessor
from stream_ndcg.core_build import core_build
from stream_ndcg.dead_letters import DeadLetters
from stream_ndcg.drilldown.api import Api
from stream_ndcg.drilldown.clicks import ClickEvidence
from stream_ndcg.drilldown.experiments import ExperimentReports
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.exporter import Exporter, WindowTotals, WindowView
from stream_ndcg.foreground import run_in_foreground
from stream_ndcg.source.kafka import KafkaSource, consumer_options, new_consumer

logger = logging.getLogger(__name__)


# The collector's youngest generation is collected after this many new container objects (700
# by default). Every batch builds and drops hundreds of thousands of them, and each full
# collection walks the state cache's groups: with the defaults the collector takes a large share
# of the service's CPU on the drill-down bench, with these a small one (bench/RESULTS.md).
YOUNG_COLLECTION_THRESHOLD = 50_000


def collect_garbage_for_batches() -> None:
    """Tune the cyclic garbage collector for a process that runs batches over a large live
    state: objects alive at start are left out of every collection (`gc.freeze`), and
    collections run a seventieth as often. Reference counting still frees what a batch drops;
    only cycles wait longer."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, 20, 20)


# How often the C allocator is told to give back the pages it holds free (`return_freed_memory`).
FREED_MEMORY_RETURN_S = 1.0


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, which hands the free pages of the C heap back to the system; None
    where the C library has none (musl, macOS)."""
    try:
        # The symbols the interpreter's process has loaded, its C library's among them.
        process = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
    trim: Callable[[int], int] | None = getattr(process, "malloc_trim", None)
    return trim


def return_freed_memory(every_s: float = FREED_MEMORY_RETURN_S) -> Callable[[], None]:
    """Hand the C heap's free pages back to the system every `every_s` seconds, in a daemon
    thread; returns what stops it. Python's objects above 512 bytes (the tables of the large dicts
    and lists of a head query's state and of the drill-down's index, the Redis replies and the
    Kafka fetches) live in the C heap, and glibc returns only its top: the holes their growth and
    turnover leave stayed resident, and grew with the impressions held (bench/RESULTS.md). A trim
    walks the heap's free chunks with the GIL released, once a second; no result depends on it."""
    trim = malloc_trim()
    stop = threading.Event()
    if trim is None:
        logger.info("no malloc_trim in this C library: the C heap's free pages stay with the process")
        return stop.set

    def loop() -> None:
        while not stop.wait(every_s):
            trim(0)

    threading.Thread(target=loop, name="return-freed-memory", daemon=True).start()
    return stop.set


def build(settings: Settings, registry: CollectorRegistry | None = None) -> tuple[StreamProcessor, Exporter]:
    registry = registry or CollectorRegistry()
    holder: list[Exporter] = []
    store = wiring.redis_store(settings,
                               lambda seconds: holder[0].redis_seconds.observe(seconds) if holder else None)
    # The image sets the source revision at build time (Dockerfile ARG REVISION); it is not a setting.
    exporter = Exporter(registry, store, WindowView.from_settings(settings),
                        revision=os.environ.get("STREAM_NDCG_REVISION", "unknown"), state_cache=store.cache_figures)
    holder.append(exporter)
    kafka_options = settings.kafka_client_options()
    options = consumer_options(kafka_options, group_id=settings.group_id,
                               auto_offset_reset=settings.auto_offset_reset, batch_size=settings.batch_size,
                               max_message_bytes=settings.max_message_bytes)
    dead_letters = (DeadLetters(lambda: KafkaProducer(**kafka_options, acks="all", linger_ms=5),
                                settings.dead_letter_topic, exporter.dead_letters_dropped.inc)
                    if settings.dead_letter_topic else None)
    pipeline = wiring.batch_pipeline(settings, store, wiring.engine(settings), dead_letters=dead_letters)
    processor = StreamProcessor(KafkaSource(lambda: new_consumer(options)), store, pipeline, exporter,
                                wiring.processor_options(settings))
    return processor, exporter


def explorer(settings: Settings, window_totals: WindowTotals | None = None) -> Explorer:
    """The drill-down's reader, on a store of its own: its reads never touch the consumer's cache.
    Its summary reads `window_totals` (the exporter's, in `run`) if given; a query's click evidence,
    the judge's store under the same namespace."""
    label, _, value = settings.control.partition("=")
    return Explorer(wiring.redis_store(settings), WindowView.from_settings(settings), settings.measure,
                    settings.horizon, window_totals=window_totals,
                    clicks=ClickEvidence(wiring.judge_store(settings), settings.key_namespace),
                    control=(label, value) if settings.control else None, alpha=settings.alpha,
                    n_star=settings.n_star, query_figures_interval_s=settings.query_figures_interval / 1000)


def experiment_reports(settings: Settings) -> ExperimentReports:
    """The experiments' reports, on a store of their own (reads only)."""
    return ExperimentReports(wiring.redis_store(settings), settings.experiments, settings.k, settings.bucket)


def run(settings: Settings) -> int:
    """`stream-ndcg run`: serve metrics (and the drill-down API) and consume until SIGTERM or Ctrl-C; exit 0."""
    logger.info("stream-ndcg %s, %s", __version__, core_build().describe())
    processor, exporter = build(settings)
    collect_garbage_for_batches()
    closing = [exporter.close, return_freed_memory()]
    if settings.drilldown:
        reader = explorer(settings, exporter.window_totals)
        exporter.export_query_figures(reader.figures)
    if settings.api_port and settings.drilldown:
        api = Api(reader, token=settings.api_token, experiments=experiment_reports(settings))
        api_port = api.serve(settings.api_host, settings.api_port)
        closing.append(api.close)
        logger.info("drill-down API and page on http://%s:%d/", settings.api_host, api_port)
    elif not settings.drilldown:
        logger.info("drill-down off (drilldown=false): no per-query rows are kept and no API is served")
    return run_in_foreground(processor, lambda ready: exporter.serve(settings.metrics_host, settings.metrics_port,
                                                                     ready),
                             settings.metrics_host, closing=closing)
