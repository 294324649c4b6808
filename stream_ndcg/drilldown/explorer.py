"""The drill-down questions, answered from a store: the API's and `stream-ndcg judging-queue`'s.

An `Explorer` reads the shared state (so any instance answers for every
partition) and keeps a `index.QueryIndex` of its rows, brought up to date
before each answer by reading only what the store logged since the last one.
Its answers are plain JSON-ready dicts, to questions `question.Question.parse`
has checked.

    explorer = Explorer(store, WindowView.from_settings(settings), settings.measure, settings.horizon)
    explorer.queries(Question.parse({"window": ["1h"], "k": ["10"], "segment.variant": ["B"]}, explorer.view))
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from stream_ndcg import rows
from stream_ndcg.comparisons import ALPHA, N_STAR
from stream_ndcg.drilldown import compare, index, queue
from stream_ndcg.drilldown.clicks import ClickEvidence, of_query
from stream_ndcg.drilldown.question import Question, check_query_id
from stream_ndcg.errors import BadParameter, NotFound
from stream_ndcg.exporter import WindowTotals, WindowView
from stream_ndcg.metric import Measure, ideal_dcg
from stream_ndcg.query_figures import PeriodicQueryFigures
from stream_ndcg.query_state import effective_grade
from stream_ndcg.setting_values import format_duration
from stream_ndcg.state.base import StateStore
from stream_ndcg.windows import means, oldest_kept_bucket

# Queries whose unjudged exposures the judging queue keeps between requests (the head of the queue).
EXPOSURES_KEPT = 20_000
# What the summary reports of `windows.means` per cut-off.
SUMMARY_FIGURES = ("ndcg_mean", "ndcg_standard_error", "dcg_mean", "dcg_standard_error", "judged_ratio",
                   "scored_impressions")

class Explorer:
    """Answers the drill-down questions from a store; safe to call from several threads."""

    def __init__(self, store: StateStore, view: WindowView, measure: Measure, horizon_ms: int,
                 clock: Callable[[], float] = time.time, window_totals: WindowTotals | None = None, *,
                 clicks: ClickEvidence | None = None, control: tuple[str, str] | None = None,
                 alpha: float = ALPHA, n_star: float = N_STAR, query_figures_interval_s: float = 0.0) -> None:
        self.store, self.view = store, view
        # The judge's grades and evidence of a query's documents (None: not read, and said so), and the
        # summary's comparisons: the control when a request names none, with their alpha and N*.
        self.clicks, self.control, self.alpha, self.n_star = clicks, control, alpha, n_star
        # The summary's sums: the exporter's in the service (the gauges' numbers, read once for
        # both), else kept here.
        self.window_totals = window_totals or WindowTotals(store, view)
        self.measure, self.horizon_ms, self.clock = measure, horizon_ms, clock
        # The summary's figures over queries, brought up to date at most once per interval (0: at
        # every call); the exporter serves the same computation (`Exporter.export_query_figures`).
        self.figures = PeriodicQueryFigures(self.query_figures, lambda: view.now_ms(store, clock),
                                            query_figures_interval_s, clock)
        self.index = index.QueryIndex(rows.row_fields(measure.cutoffs), self.figures.pacer)
        self._cursors: dict[str, str | None] = {}
        # (query, k) -> (the query's index version when read, its unjudged exposures per group).
        self._exposures: OrderedDict[tuple[str, int], tuple[int, queue.GroupExposures]] = OrderedDict()
        self._lock = threading.Lock()

    def _now_ms(self) -> int:
        with self._lock:
            if self.store.follow():
                # A rebuild started a new generation: everything read so far describes the old one.
                self.index = index.QueryIndex(self.index.fields, self.figures.pacer)
                self._cursors.clear()
                self._exposures.clear()
        now = self.view.now_ms(self.store, self.clock)
        if now is None:
            raise NotFound("window", "no event has been applied yet")
        return now

    def _refresh(self, now_ms: int) -> int:
        """Read what the store logged since the last answer; the oldest bucket held."""
        oldest = oldest_kept_bucket(now_ms, self.horizon_ms, self.view.bucket_ms)
        for partition, read in self.store.read_all_rows(self._cursors, oldest).items():
            if read.whole:
                self.index.drop_partition(partition)
            for bucket, segment, query_id, row in read.rows:
                # A row of another length predates an in-place change of k: left out until rewritten.
                if bucket >= oldest and len(row) == len(self.index.fields):
                    self.index.put(partition, bucket, segment, query_id, row)
                    self.figures.pacer()
            self._cursors[partition] = read.cursor
        self.index.drop_before(oldest)
        return oldest

    def _unjudged(self, query_ids: list[str], k: int) -> dict[str, queue.GroupExposures]:
        """`queue.unjudged_exposures` of each query, over all its partitions: read from the
        store only for queries whose rows changed since they were last read (the lock is held)."""
        found: dict[str, queue.GroupExposures] = {}
        stale: dict[str, set[str]] = {}
        for query_id in query_ids:
            held = self._exposures.get((query_id, k))
            if held is not None and held[0] == self.index.version(query_id):
                self._exposures.move_to_end((query_id, k))
                found[query_id] = held[1]
            else:
                stale[query_id] = self.index.partitions_of(query_id)
                found[query_id] = {}
        for partition in sorted(set().union(*stale.values())):
            wanted = [query_id for query_id, homes in stale.items() if partition in homes]
            for query_id, state in self.store.load(partition, wanted, {}).states.items():
                merged = found[query_id]
                for key, docs in queue.unjudged_exposures(state, k, self.measure.sources).items():
                    into = merged.setdefault(key, {})
                    for doc, (exposure, rank) in docs.items():
                        had = into.get(doc)
                        into[doc] = (exposure, rank) if had is None else (had[0] + exposure, min(had[1], rank))
        for query_id in stale:
            self._exposures[(query_id, k)] = (self.index.version(query_id), found[query_id])
        while len(self._exposures) > EXPOSURES_KEPT:
            self._exposures.popitem(last=False)
        return found

    def _edges(self, first: int, last: int) -> dict[str, int]:
        """The window's time span: from the start of its first bucket to the end of its last."""
        return {"from_ms": first * self.view.bucket_ms, "to_ms": (last + 1) * self.view.bucket_ms}

    def _buckets(self, question: Question, now_ms: int) -> tuple[int, int]:
        return self.view.window_buckets(now_ms, question.window_ms)

    def query_figures(self, now_ms: int, wanted: Mapping[int, Iterable[tuple[str, ...]]]) -> dict[
            int, dict[tuple[str, ...], list[dict[str, float | None]]]]:
        """Per window and segment values in `wanted`, the figures over the window's queries per
        cut-off (`index.QueryIndex.over_queries`): what the exporter exports beside the means."""
        labels = self.view.segment_labels
        with self._lock:
            self._refresh(now_ms)
            return {window: {values: self.index.over_queries(*self.view.window_buckets(now_ms, window),
                                                              dict(zip(labels, values, strict=True)))
                             for values in all_values}
                    for window, all_values in wanted.items()}

    def summary(self, question: Question) -> dict[str, Any]:
        """The window means per segment: the numbers the gauges show, each mean with its
        impression-level and query-clustered standard errors, and the query-averaged means (as of
        the last computation of the figures over queries, `query_figures_as_of_ms`)."""
        now = self._now_ms()
        first, last = self._buckets(question, now)
        totals = self.window_totals.at(now)[question.window_ms]
        computed = self.figures.latest(now, {question.window_ms: list(totals)})
        over_queries = computed.figures[question.window_ms]
        rows = []
        for values, sums in sorted(totals.items()):
            by_k = means(sums, self.view.cutoffs)
            rows.append({
                "segment": dict(zip(self.view.segment_labels, values, strict=True)),
                "impressions": by_k[str(self.view.cutoffs[0])]["impressions"],
                "k": {k: {**{name: row[name] for name in SUMMARY_FIGURES}, **over_queries[values][i]}
                      for i, (k, row) in enumerate(by_k.items())},
            })
        control = question.control or self.control
        return {"window": format_duration(question.window_ms),
                "windows": [format_duration(w) for w in self.view.windows_ms],
                "cutoffs": list(self.view.cutoffs), "segment_labels": list(self.view.segment_labels),
                "now_ms": now, "buckets": [first, last], **self._edges(first, last), "rows": rows,
                "query_figures_as_of_ms": computed.now_ms,
                "query_figures_age_s": round(max(0.0, self.clock() - computed.at_s), 3),
                "comparisons": None if control is None else self._comparisons(control, totals, first, last)}

    def _comparisons(self, control: tuple[str, str], totals: Mapping[tuple[str, ...], Mapping[str, float]],
                     first: int, last: int) -> dict[str, Any]:
        """Every other value of the control's label against it, per cut-off (`compare.with_control`)."""
        label = control[0]
        at = self.view.segment_labels.index(label)
        # The index's rows change in place as it reads on: the arms are taken while it is held.
        with self._lock:
            tables = {values[at]: self.index.window(first, last, {label: values[at]}) for values in totals}
            arms = [compare.arms_at(totals, at, tables, i, k) for i, k in enumerate(self.view.cutoffs)]
        return compare.with_control(control, self.view.cutoffs, arms, self.alpha, self.n_star)

    def queries(self, question: Question) -> dict[str, Any]:
        """Per query: the window's figures, and the change against `vs`."""
        now = self._now_ms()
        first, last = self._buckets(question, now)
        at = self.view.cutoffs.index(question.k)
        with self._lock:
            oldest = self._refresh(now)
            table = self.index.window(first, last, question.segment)
            other, vs_buckets = None, None
            if question.vs == "previous":
                length = last - first + 1
                if first - length < oldest:
                    raise BadParameter("vs", f"the {format_duration(question.window_ms)} before this one is behind "
                                             f"the retention horizon ({format_duration(self.horizon_ms)}): raise "
                                             "grace to serve it")
                vs_buckets = [first - length, first - 1]
                other = self.index.window(first - length, first - 1, question.segment)
            elif isinstance(question.vs, tuple):
                label, value = question.vs
                other = self.index.window(first, last, {**question.segment, label: value})
            total, shown = index.page(table, other, at, min_impressions=question.min_impressions,
                                          sort=question.sort, descending=question.descending,
                                          offset=question.offset, limit=question.limit)
        return {"window": format_duration(question.window_ms), "k": question.k, "segment": question.segment,
                "vs": _vs_text(question.vs), "sort": question.sort, "order": "desc" if question.descending else "asc",
                "limit": question.limit, "offset": question.offset, "total": total, "now_ms": now,
                "buckets": [first, last], **self._edges(first, last), "vs_buckets": vs_buckets,
                "queries": shown}

    def query(self, query_id: str, question: Question) -> dict[str, Any]:
        """One query in the window: its distinct lists scored, its ideal, its judgments' history, and
        its documents' grades and evidence from clicks (`clicks.ClickEvidence`)."""
        check_query_id(query_id)
        now = self._now_ms()
        first, last = self._buckets(question, now)
        with self._lock:
            self._refresh(now)
            partitions = sorted(self.index.partitions_of(query_id))
            held = self.index.window(first, last, question.segment).get(query_id)
            # A copy: the index moves its sums when the next request reads what changed.
            row = list(held) if held is not None else None
        if not partitions:
            raise NotFound("query_id", "no impression of this query is held (unknown, or behind the horizon)")
        grades: dict[str, float] = {}
        # doc -> (the source its grade is from, each judging source's grade).
        sources: dict[str, tuple[str, dict[str, float | None]]] = {}
        judgments: dict[str, list[dict[str, Any]]] = {}
        lists: list[tuple[tuple[str, ...], str, int]] = []
        order = self.measure.sources
        for partition in partitions:
            state = self.store.load(partition, [query_id], {}).states.get(query_id)
            if state is not None:
                for doc, revisions in state.revisions.items():
                    winners = state.winners(doc)
                    found = effective_grade(winners, order)
                    if found is not None:
                        grades[doc] = found[0]
                        sources[doc] = (found[1], {s: winners[s][2] for s in order if s in winners})
                    judgments.setdefault(doc, []).extend(
                        {"ts": ts, "event_id": event_id, "grade": grade, "source": source}
                        for ts, event_id, grade, source in revisions)
            lists += [(ranked, segment, count)
                      for (bucket, segment, ranked), count in self.store.ranked_lists(partition, query_id).items()
                      if first <= bucket <= last and index.matches(segment, question.segment)]
        for history in judgments.values():
            history.sort(key=lambda j: (j["ts"], j["event_id"] or ""))
        ideal = sorted(grades.items(), key=lambda item: (-item[1], item[0]))
        details = index.list_details(lists, grades, self.measure, {doc: held[0] for doc, held in sources.items()})
        gains = [self.measure.gain_of(g) for g in grades.values()]
        clicks = of_query(self.clicks, query_id, partitions,
                          {*grades, *(doc for ranked, _, _ in lists for doc in ranked)}, sources)
        return {
            "query_id": query_id, "window": format_duration(question.window_ms), "now_ms": now,
            "buckets": [first, last], **self._edges(first, last), "cutoffs": list(self.measure.cutoffs),
            "ideal": self.measure.ideal,
            "gain": self.measure.gain, "segment": question.segment,
            "summary": {"impressions": row[0] if row else 0.0,
                        "k": {str(k): index.figures(row, i) if row else None
                              for i, k in enumerate(self.measure.cutoffs)}},
            "lists": details[:question.limit], "lists_total": len(details),
            "ideal_ordering": [{"doc_id": doc, "grade": grade, "source": sources[doc][0],
                                "source_grades": sources[doc][1]} for doc, grade in ideal],
            "ideal_dcg": {str(k): ideal_dcg(gains, k) for k in self.measure.cutoffs},
            "judgments": dict(sorted(judgments.items())), "clicks": clicks,
        }

    def judging_queue(self, question: Question) -> dict[str, Any]:
        """The unjudged pairs holding the most top-k exposure of the window."""
        now = self._now_ms()
        first, last = self._buckets(question, now)
        at = self.view.cutoffs.index(question.k)
        with self._lock:
            self._refresh(now)
            table = self.index.window(first, last, question.segment)
            def pairs_of(query_ids: list[str]) -> dict[str, dict[str, queue.Pair]]:
                return {query_id: queue.pairs_in(groups, first, last, question.segment)
                        for query_id, groups in self._unjudged(query_ids, question.k).items()}

            pairs = queue.judging_queue(table, at, question.limit, pairs_of)
            total = index.total_exposure(table, at)
            traffic = {p.query_id: _traffic(table[p.query_id], at) for p in pairs}
        return {
            "window": format_duration(question.window_ms), "k": question.k, "segment": question.segment,
            "now_ms": now, "buckets": [first, last], **self._edges(first, last), "total_exposure": total,
            "pairs": [{"query_id": p.query_id, "doc_id": p.doc_id, "exposure": p.exposure,
                       "share": p.exposure / total if total else None, "best_rank": p.best_rank,
                       **traffic[p.query_id]} for p in pairs],
        }


def _traffic(row: Sequence[float], at: int) -> dict[str, Any]:
    figures = index.figures(row, at)
    return {"query_impressions": figures["impressions"], "query_judged_ratio": figures["judged_ratio"]}


def _vs_text(vs: str | tuple[str, str] | None) -> str | None:
    return vs if vs is None or isinstance(vs, str) else f"{vs[0]}:{vs[1]}"
