"""`stream-ndcg demo`: Kafka, Redis, the service and live simulated traffic, with a view in the terminal.

The traffic's users click by the simulator's position-based model of hidden true grades, and the
raters' judgments are those true grades. Two pipelines read the topic: `run` scoring with the
raters' judgments only (`judgment_sources = "raters"`: nDCG from the true grades), and `run` in a
group of its own (`CLICKS_GROUP`) scoring with the judgments `judge` derives from the clicks
(`judgment_sources = "coec"`), as docs/click-judgments.md sets up both numbers on one dashboard;
the view shows them side by side. `judge` decides every minute, so that click judgments show
within the first minutes.

Everything it starts runs under a temporary directory and stops on Ctrl-C.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from prometheus_client import CollectorRegistry

from stream_ndcg import judge_service
from stream_ndcg.config import Settings
from stream_ndcg.devtools.producer import produce
from stream_ndcg.devtools.redis_servers import RedisServer
from stream_ndcg.devtools.servers import KafkaBroker
from stream_ndcg.devtools.simulator import SimulationSpec, Simulator
from stream_ndcg.drilldown.api import Api
from stream_ndcg.service import build, experiment_reports, explorer
from stream_ndcg.setting_values import format_duration
from stream_ndcg.vocabulary import MetricName, total

TOPIC = "search-events"
CLICKS_GROUP = "stream-ndcg-clicks"
# Short enough for judgments within the first minutes of wall clock: a judgment every minute, from
# the clicks of the last hour (the simulator's clicks come at most a minute after their search).
CLICK_SETTINGS = {"judge_interval": "1m", "click_session": "1m", "click_bucket": "5m", "click_horizon": "1h"}


def _traffic(bootstrap: str, rate: float, stop: threading.Event) -> None:
    spec = SimulationSpec(events=10**9, seed=int(time.time()), rate=rate, start_ms=int(time.time() * 1000),
                          max_delay_ms=45_000, malformed_share=0.002, engines=("web", "app"), clicks=True)

    def until_stopped() -> Iterator[tuple[bytes, bytes]]:
        # Each event carries the time it is sent, so the shortest window always holds the newest.
        for message in Simulator(spec, clock=lambda: int(time.time() * 1000)).messages():
            if stop.is_set():
                return
            yield message

    produce(bootstrap, TOPIC, until_stopped(), paced=True, rate=rate)


def _view(registry: CollectorRegistry, clicks: CollectorRegistry, judge: CollectorRegistry, settings: Settings,
          port: int, api_port: int, started: float) -> str:
    k = str(max(settings.k))
    events = _total(registry, total(MetricName.EVENTS))
    lines = [f"stream-ndcg demo   metrics: http://{settings.metrics_host}:{port}/metrics   Ctrl-C stops everything",
             f"                   drill-down page: http://{settings.api_host}:{api_port}/",
             f"nDCG@{k}: from the raters' judgments (the true grades); clicks: from judge's COEC judgments "
             f"(group {CLICKS_GROUP})",
             "",
             f"{'window':>7} {'variant':>8} {'nDCG@' + k:>9} {'clicks':>7} {'DCG@' + k:>8} {'judged@' + k:>10} "
             f"{'impressions':>12}"]
    for window in settings.windows:
        for variant in ("A", "B"):
            w = format_duration(window)
            ndcg = _sum_ratio(registry, MetricName.NDCG_NUMERATOR, MetricName.SCORED_IMPRESSIONS, k, w, variant)
            by_clicks = _sum_ratio(clicks, MetricName.NDCG_NUMERATOR, MetricName.SCORED_IMPRESSIONS, k, w, variant)
            lines.append(
                f"{w:>7} {variant:>8} {ndcg:>9.4f} {by_clicks:>7.4f} "
                f"{_weighted(registry, MetricName.DCG, k, w, variant):>8.3f} "
                f"{_weighted(registry, MetricName.JUDGED_RATIO, k, w, variant):>10.3f} "
                f"{_total(registry, MetricName.IMPRESSIONS, window=w, variant=variant):>12.0f}")
    lag = sum(s.value for m in registry.collect() for s in m.samples if s.name == MetricName.CONSUMER_LAG)
    elapsed = max(1e-9, time.monotonic() - started)
    lines += ["", f"events/s {events / elapsed:8.0f}   consumer lag {lag:6.0f}   "
                  f"rejected {_total(registry, total(MetricName.EVENTS_REJECTED)):5.0f}",
              f"judge: clicks {_total(judge, total(MetricName.JUDGE_EVENTS), type='click'):8.0f}   "
              f"pairs graded {_total(judge, MetricName.JUDGE_GRADED_PAIRS):6.0f}"]
    return "\n".join(lines)


def _total(registry: CollectorRegistry, name: str, **match: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in match.items()))


def _weighted(registry: CollectorRegistry, name: str, k: str, window: str, variant: str) -> float:
    """A per-impression mean across engines: each engine's mean weighted by its impressions."""
    means = {s.labels["engine"]: s.value for m in registry.collect() for s in m.samples
             if s.name == name and s.labels.get("k") == k and s.labels.get("window") == window
             and s.labels.get("variant") == variant}
    weights = {engine: _total(registry, MetricName.IMPRESSIONS, window=window, variant=variant, engine=engine)
               for engine in means}
    total = sum(weights.values())
    return sum(means[e] * weights[e] for e in means if weights[e]) / total if total else float("nan")


def _sum_ratio(registry: CollectorRegistry, numerator: str, denominator: str, k: str, window: str,
               variant: str) -> float:
    """The across-engine mean, built from sums as a recording rule would."""
    top = _total(registry, numerator, k=k, window=window, variant=variant)
    bottom = _total(registry, denominator, k=k, window=window, variant=variant)
    return top / bottom if bottom else float("nan")


def run(rate: float = 300.0, metrics_port: int = 9464, api_port: int = 9465) -> int:
    with tempfile.TemporaryDirectory(prefix="stream-ndcg-demo-") as root:
        print("starting Kafka and Redis (the first run fetches Kafka's jars with Maven)...", file=sys.stderr)
        with KafkaBroker.start(Path(root, "kafka")) as kafka, RedisServer.start(Path(root, "redis")) as redis:
            admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
            admin.create_topics([NewTopic(TOPIC, 3, 1)])
            admin.close()
            flags = {"bootstrap_servers": kafka.bootstrap, "redis_url": redis.url, "topics": TOPIC,
                     "segment_labels": "variant,engine", "windows": "1m,5m,1h", "metrics_port": str(metrics_port),
                     "api_port": str(api_port), "control": "variant=A",
                     # An experiment from the demo's start, so the page and the API show one.
                     "experiments": f"name=demo,start={int(time.time() * 1000)},label=variant,arms=A|B,control=A",
                     **CLICK_SETTINGS}
            settings = Settings.load(flags={**flags, "judgment_sources": "raters"})
            registry, clicks, judged = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
            processor, exporter = build(settings, registry)
            by_clicks, clicks_exporter = build(Settings.load(flags={**flags, "group_id": CLICKS_GROUP,
                                                                    "judgment_sources": "coec"}), clicks)
            judge, judge_exporter = judge_service.build(settings, judged)
            port = exporter.serve(settings.metrics_host, settings.metrics_port, ready=processor.ready)
            api = Api(explorer(settings), experiments=experiment_reports(settings))
            api_port = api.serve(settings.api_host, settings.api_port)
            stop = threading.Event()
            producer = threading.Thread(target=_traffic, args=(kafka.bootstrap, rate, stop), daemon=True)
            loops = [threading.Thread(target=loop.run, daemon=True) for loop in (processor, by_clicks, judge)]
            producer.start()
            for loop in loops:
                loop.start()
            started = time.monotonic()
            try:
                while all(loop.is_alive() for loop in loops):
                    sys.stdout.write("\x1b[H\x1b[2J" + _view(registry, clicks, judged, settings, port, api_port,
                                                              started) + "\n")
                    sys.stdout.flush()
                    time.sleep(2)
            except KeyboardInterrupt:
                pass
            finally:
                stop.set()
                for stopping in (processor, by_clicks, judge):
                    stopping.shutdown()
                for loop in loops:
                    loop.join(timeout=30)
                producer.join(timeout=10)
                for closing in (exporter, clicks_exporter, judge_exporter):
                    closing.close()
                api.close()
    print("stopped Kafka, Redis, the services and the judge", file=sys.stderr)
    return 0
