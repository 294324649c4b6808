"""`judge`'s metrics read from its shared state at scrape time, so every instance reports the same:
the events it took in (by type, duplicate and rejection reason), the pairs graded by grade, and
CTR by rank at the last boundary decided (the position bias the COEC model divides out).
`exporter.Exporter` registers it for `judge`."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stream_ndcg.errors import StoreUnavailable
from stream_ndcg.state.judge_store import JudgeStore
from stream_ndcg.vocabulary import CLICK, IMPRESSION, JUDGMENT, MetricName, duplicate, rejection_reason

logger = logging.getLogger(__name__)


class JudgeCollector(Collector):
    def __init__(self, store: JudgeStore, pipeline: str, model: str,
                 on_error: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.pipeline = pipeline
        self.model = model
        self.on_error = on_error

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            figures = self.store.figures()
        except StoreUnavailable as exc:
            self.on_error()
            logger.warning("scrape could not read the judge's state: %s", exc)
            return
        counts: Counter[str] = Counter()
        grades: Counter[str] = Counter()
        latest: list[list[int]] | None = None
        for meta in figures.values():
            counts.update(orjson.loads(meta.get("counts", "{}")))
            grades.update(orjson.loads(meta.get("grades", "{}")))
            ctr = orjson.loads(meta.get("ctr", "null"))
            if ctr is not None and (latest is None or ctr[0] > latest[0][0]):
                latest = [[ctr[0]], ctr[1], ctr[2]]
        pipeline = [self.pipeline]
        events = CounterMetricFamily(MetricName.JUDGE_EVENTS, "Events judge took in, by type (judgments are "
                                     "counted and not used).", labels=["pipeline", "type"])
        for kind in (IMPRESSION, CLICK, JUDGMENT):
            events.add_metric([*pipeline, kind], counts.get(kind, 0))
        duplicates = CounterMetricFamily(MetricName.JUDGE_EVENTS_DUPLICATE, "Impressions and clicks judge took "
                                         "as duplicates, by type.", labels=["pipeline", "type"])
        for kind in (IMPRESSION, CLICK):
            duplicates.add_metric([*pipeline, kind], counts.get(duplicate(kind), 0))
        rejected = CounterMetricFamily(MetricName.JUDGE_EVENTS_REJECTED, "Events judge rejected, by reason.",
                                       labels=["pipeline", "reason"])
        for name, n in sorted(counts.items()):
            reason = rejection_reason(name)
            if reason is not None:
                rejected.add_metric([*pipeline, reason], n)
        graded = GaugeMetricFamily(MetricName.JUDGE_GRADED_PAIRS, "(query, document) pairs holding a grade from "
                                   "clicks, by grade.", labels=["pipeline", "model", "grade"])
        for grade, n in sorted(grades.items()):
            graded.add_metric([*pipeline, self.model, grade], n)
        ctr_family = GaugeMetricFamily(MetricName.JUDGE_CTR, "Click-through rate by rank over the click horizon at "
                                       "the last boundary decided: clicks over impressions with a result there.",
                                       labels=["pipeline", "rank"])
        boundary = GaugeMetricFamily(MetricName.JUDGE_BOUNDARY, "The last boundary judge decided (Unix seconds, "
                                     "by its clock: the wall's or the events').", labels=["pipeline"])
        if latest is not None:
            boundary.add_metric(pipeline, latest[0][0] / 1000)
            for rank, (shown, clicked) in enumerate(zip(latest[1], latest[2], strict=True), start=1):
                if shown:
                    ctr_family.add_metric([*pipeline, str(rank)], clicked / shown)
        yield from (events, duplicates, rejected, graded, ctr_family, boundary)
