"""The offline replay: the batch computation over files of events, and the service's oracle.

It keeps every distinct impression and every judgment revision, then scores
each impression from scratch with `metric.score_list` against the final
judgments of its query. No window and no expiry: every event of the input
counts, whenever it arrived. The one clock is the dedup horizon's, the newest
event time so far: with `dedup_horizon_ms`, an impression id seen again once
that clock has moved that far past its bucket when the id was accepted is a new
impression, as in the service with the event clock (whose clock is its
partition's).

    replay = Replay(Measure(cutoffs=(5, 10)))
    for line in open("events.jsonl", "rb"):
        replay.add(line)
    print(replay.summary())

With a `click_judge.ClickJudge` the judgments come from the clicks instead: the
impressions and clicks go to the judge in file order, and each judgment it decides
at a boundary of its clock is applied as a judgment event of the file would be, as
`run` would apply the judge's (the file's own judgment events are counted and set
aside). The judge's clock is the file's, so the judgments are those of `judge` on
one partition with the event clock: events after the last boundary it passed are in
none of them.

A document's grade is the service's: of each judgment source, its greatest revision; of the
measure's `sources`, the first that grades the document. A judgment of a source it does not
list is counted and set aside, as `run` sets it aside.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from stream_ndcg.click_judge import ClickJudge, ClickJudgment
from stream_ndcg.comparisons import ALPHA, N_STAR
from stream_ndcg.drilldown.compare import against
from stream_ndcg.drilldown.experiments import report
from stream_ndcg.drilldown.index import figures
from stream_ndcg.events import DEFAULT_LIMITS, Click, Impression, InvalidEvent, Judgment, Limits, parse_event
from stream_ndcg.experiments import Cells, Experiment, impression_cells
from stream_ndcg.metric import ListScore, ListScorer, Measure
from stream_ndcg.offline.totals import ScoreTotals
from stream_ndcg.rows import add_into, group_tops, impression_row, row_fields
from stream_ndcg.setting_values import format_duration
from stream_ndcg.vocabulary import (
    CLICK,
    IMPRESSION,
    JUDGMENT,
    UNLISTED_SOURCE,
    full_segment_key,
)
from stream_ndcg.windows import oldest_kept_bucket, window_buckets


class ScoredImpression(NamedTuple):
    impression: Impression
    score: ListScore


class Replay:
    """Collects events under the contract and scores them in one pass at the end."""

    def __init__(self, measure: Measure, limits: Limits = DEFAULT_LIMITS,
                 tap: Callable[[bytes | str], None] | None = None, *,
                 dedup_horizon_ms: int | None = None, bucket_ms: int = 60_000,
                 click_judge: ClickJudge | None = None,
                 on_click_judgment: Callable[[ClickJudgment], None] | None = None) -> None:
        self.measure = measure
        self.dedup_horizon_ms = dedup_horizon_ms
        self.bucket_ms = bucket_ms
        self.limits = limits
        # Given every message applied, in order, and the judgments from clicks as they are decided:
        # `offline.history.History.add` replays them too.
        self.tap = tap
        # Judgments from clicks instead of the files' (`click_judge.ClickJudge`), and who sees each.
        self.click_judge = click_judge
        self.on_click_judgment = on_click_judgment
        # The files' judgment events, counted and not applied when the judgments come from clicks.
        self.set_aside = 0
        # The replay holds every event it keeps as a plain tuple of its fields: the garbage collector
        # may stop tracking a tuple of strings and numbers, never a named tuple (or a dataclass),
        # and its full passes over every event held took a fifth of a replay with dataclasses.
        self._impressions: list[tuple[Any, ...]] = []
        # impression id -> the bucket of the clock when an impression with it was last accepted.
        self._impression_buckets: dict[str, int] = {}
        # query -> doc -> source -> (precedence, grade) of its greatest revision so far.
        self._winners: dict[str, dict[str, dict[str, tuple[tuple[int, bool, str, bool, float], float | None]]]] = {}
        self._revisions: set[tuple[Any, ...]] = set()
        self.duplicates: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        # Clicks, counted and set aside as the service sets them aside (no clock moves for them).
        self.clicks = 0
        # Judgments of a source the measure does not list, the same.
        self.unlisted = 0
        # The smallest event time applied, to notice files written in epoch seconds.
        self.earliest_ts: int | None = None
        # The newest: where the event clock of the service would stand.
        self.latest_ts: int | None = None

    def add(self, raw: bytes | str) -> InvalidEvent | None:
        """Apply one message; return its rejection, if any."""
        event = parse_event(raw, self.limits)
        if self.click_judge is not None and isinstance(event, Judgment):
            self.set_aside += 1
            return None
        if self.tap is not None:
            self.tap(raw)
        if isinstance(event, InvalidEvent):
            self.rejected[event.reason] += 1
            return event
        if self.click_judge is not None and isinstance(event, Impression | Click):
            for judgment in self.click_judge.add(event):
                self._click_judgment(judgment)
        if isinstance(event, Click):
            self.clicks += 1
            return None
        self._apply(event)
        return None

    def _listed(self, event: Impression | Judgment) -> bool:
        """Whether the event counts: any impression, a judgment of a source the measure lists (one of
        another source is counted here as set aside)."""
        if isinstance(event, Judgment) and event.source not in self.measure.sources:
            self.unlisted += 1
            return False
        return True

    def _click_judgment(self, judgment: ClickJudgment) -> None:
        """Apply a judgment decided from clicks, as `run` applies the judge's."""
        if self.tap is not None:
            self.tap(json.dumps(judgment.message()))
        if self.on_click_judgment is not None:
            self.on_click_judgment(judgment)
        self._apply(judgment.judgment())

    def _apply(self, event: Impression | Judgment) -> None:
        if not self._listed(event):
            return
        ts = event.ts
        if self.earliest_ts is None or ts < self.earliest_ts:
            self.earliest_ts = ts
        if self.latest_ts is None or ts > self.latest_ts:
            self.latest_ts = ts
        clock = self.latest_ts
        if isinstance(event, Impression):
            seen = self._impression_buckets.get(event.impression_id)
            if seen is not None and (self.dedup_horizon_ms is None or seen >= oldest_kept_bucket(
                    clock, self.dedup_horizon_ms, self.bucket_ms)):
                self.duplicates[IMPRESSION] += 1
            else:
                # Remembered from the clock's bucket, as the service remembers it.
                self._impression_buckets[event.impression_id] = clock // self.bucket_ms
                self._impressions.append(tuple(event))
            return
        revisions = self._revisions
        held = len(revisions)
        revisions.add(tuple(event))
        if len(revisions) == held:
            self.duplicates[JUDGMENT] += 1
            return
        winners = self._winners.get(event.query_id)
        if winners is None:
            winners = self._winners[event.query_id] = {}
        by_source = winners.get(event.doc_id)
        if by_source is None:
            by_source = winners[event.doc_id] = {}
        current = by_source.get(event.source)
        precedence = event.precedence
        if current is None or precedence > current[0]:
            by_source[event.source] = (precedence, event.grade)

    def grades(self, query_id: str) -> dict[str, float]:
        """Each graded document's grade: the first of the measure's sources that grades it."""
        found: dict[str, float] = {}
        for doc, by_source in self._winners.get(query_id, {}).items():
            for source in self.measure.sources:
                held = by_source.get(source)
                if held is not None and held[1] is not None:
                    found[doc] = held[1]
                    break
        return found

    def scored(self) -> Iterator[ScoredImpression]:
        """Every distinct impression, scored with every judgment applied, in arrival order."""
        for fields, score in self._scores():
            yield ScoredImpression(Impression._make(fields), score)

    def _scores(self) -> Iterator[tuple[tuple[Any, ...], ListScore]]:
        """`scored`, each impression as its plain tuple (`summary` needs only its segment)."""
        scorers: dict[str, ListScorer] = {}
        for fields in self._impressions:
            _, query_id, _, results, _, _ = fields
            scorer = scorers.get(query_id)
            if scorer is None:
                scorer = scorers[query_id] = ListScorer(self.grades(query_id), self.measure)
            yield fields, scorer.score(results)

    def per_impression(self) -> Iterator[dict[str, Any]]:
        for item in self.scored():
            yield {
                "impression_id": item.impression.impression_id,
                "query_id": item.impression.query_id,
                "ts": item.impression.ts,
                "segment": dict(item.impression.segment),
                "dcg": {str(k): v for k, v in item.score.dcg.items()},
                "ndcg": {str(k): v for k, v in item.score.ndcg.items()},
                "judged_ratio": {str(k): v for k, v in item.score.judged_ratio.items()},
            }

    def query_rows(self, first_bucket: int | None = None, last_bucket: int | None = None,
                   bucket_ms: int = 60_000) -> dict[tuple[str, str], list[float]]:
        """The drill-down rows summed per (segment key, query) over the impressions of buckets
        first..last (None: unbounded), each impression scored from scratch: what the service's
        `drilldown.index.QueryIndex.window` holds for the same buckets."""
        rows: dict[tuple[str, str], list[float]] = {}
        grades_by_query: dict[str, dict[str, float]] = {}
        groups: dict[tuple[str, str, int], list[tuple[str, ...]]] = {}
        for item in self.scored():
            impression = item.impression
            bucket = impression.ts // bucket_ms
            below = first_bucket is not None and bucket < first_bucket
            if below or (last_bucket is not None and bucket > last_bucket):
                continue
            grades = grades_by_query.get(impression.query_id)
            if grades is None:
                grades = grades_by_query[impression.query_id] = self.grades(impression.query_id)
            row = impression_row(impression.results, item.score, grades, self.measure)
            key = (full_segment_key(impression.segment), impression.query_id)
            held = rows.get(key)
            if held is None:
                rows[key] = list(row)
            else:
                add_into(held, row)
            groups.setdefault((*key, bucket), []).append(impression.results)
        # The one figure of a group, not of an impression: the top unjudged document's exposure.
        for (segment, query_id, _), lists in groups.items():
            for position, value in group_tops(lists, grades_by_query[query_id], self.measure.cutoffs):
                rows[(segment, query_id)][position] += value
        return rows

    def per_query(self, windows_ms: Iterable[int], bucket_ms: int) -> Iterator[dict[str, Any]]:
        """`stream-ndcg replay --per-query`: per window (ending at the newest event, as the service's
        event clock puts it; 0 for every impression), query and segment, the sums and figures the
        drill-down API reports."""
        fields = row_fields(self.measure.cutoffs)
        for window_ms in windows_ms:
            first, last = ((None, None) if self.latest_ts is None
                           else window_buckets(self.latest_ts, window_ms, bucket_ms) if window_ms
                           else (None, self.latest_ts // bucket_ms))
            for (segment, query_id), row in sorted(self.query_rows(first, last, bucket_ms).items(),
                                                   key=lambda item: (item[0][1], item[0][0])):
                yield {"window": format_duration(window_ms) if window_ms else "all",
                       "buckets": [first, last], "query_id": query_id, "segment": json.loads(segment),
                       "sums": dict(zip(fields, row, strict=True)),
                       "k": {str(k): figures(row, i) for i, k in enumerate(self.measure.cutoffs)}}

    def experiment_cells(self, experiment: Experiment) -> Cells:
        """An experiment's cells from every impression scored from scratch (`experiments.impression_cells`)."""
        return impression_cells(experiment, ((fields[1], fields[2], dict(fields[4]), score.ndcg)
                                             for fields, score in self._scores()), self.bucket_ms)

    def summary(self, control: tuple[str, str] | None = None, alpha: float = ALPHA,
                n_star: float = N_STAR, experiments: Sequence[Experiment] = ()) -> dict[str, Any]:
        """The means of every impression, overall and per segment value; with a `control` (label,
        value), every other value of its label compared with it (`drilldown.compare.against`);
        each experiment's report (`drilldown.experiments.report`), counted from its start."""
        cutoffs = self.measure.cutoffs
        overall = ScoreTotals(cutoffs)
        by_segment: dict[str, dict[str, ScoreTotals]] = {}
        for (_, query_id, _, _, segment, _), score in self._scores():
            overall.add(score, query_id)
            for key, value in segment:
                values = by_segment.get(key)
                if values is None:
                    values = by_segment[key] = {}
                totals = values.get(value)
                if totals is None:
                    totals = values[value] = ScoreTotals(cutoffs)
                totals.add(score, query_id)
        # The values of the control's label, each an arm.
        arms = by_segment.get(control[0], {}) if control is not None else {}
        return {
            "k": overall.means(),
            "by_segment": {key: {value: totals.means() for value, totals in sorted(values.items())}
                           for key, values in sorted(by_segment.items())},
            "events": {
                IMPRESSION: len(self._impressions),
                JUDGMENT: len(self._revisions),
                CLICK: self.clicks,
                UNLISTED_SOURCE: self.unlisted,
                "duplicate": sum(self.duplicates.values()),
                "rejected": dict(sorted(self.rejected.items())),
            },
            **({"click_judgments": {**self.click_judge.summary(), "set_aside": self.set_aside}}
               if self.click_judge is not None else {}),
            **({"comparisons": {
                "control": {"label": control[0], "value": control[1]},
                "k": {str(k): against({value: totals.arm(i) for value, totals in arms.items()}, control[1], alpha,
                                      n_star) for i, k in enumerate(cutoffs)}}}
               if control is not None else {}),
            **({"experiments": {experiment.name: report(
                experiment, self.experiment_cells(experiment), cutoffs, experiment.first_bucket(self.bucket_ms)
                * self.bucket_ms) for experiment in experiments}} if experiments else {}),
        }
