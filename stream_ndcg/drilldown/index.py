"""The drill-down's index: the per-query figures behind a window's means.

Standard library only. The engine writes one row per group it re-credits
(`rows`); a store keeps the rows of every bucket and a log of the rows each
commit wrote; `QueryIndex` holds them in memory and keeps running sums per
window, moved by the changes since its last read and by the buckets a sliding
window takes in and lets go, so a request reads sums, not impressions.

    index = QueryIndex(row_fields((10,)))
    index.put("t:0", 28_000_000, '{"variant":"B"}', "q1", (3.0, ...))
    table = index.window(27_999_941, 28_000_000, {"variant": "B"})

The judging queue is `drilldown.queue`'s.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_ndcg.drilldown.spread import QuerySpread
from stream_ndcg.metric import Measure, first_occurrences, ideal_dcg, score_list
from stream_ndcg.rows import DCG, EXPOSURE, FIGURES_PER_K, JUDGED, NDCG, SCORED, Row, add_into, row_index
from stream_ndcg.vocabulary import MISSING, parse_segment_key
from stream_ndcg.windows import mean

# (partition, segment key, query id): whose row it is, within one bucket.
RowKey = tuple[str, str, str]
SegmentFilter = Mapping[str, str]


def matches(segment_key: str, wanted: SegmentFilter) -> bool:
    """Whether a segment key has every wanted label value (a label it lacks is `none`)."""
    segment = parse_segment_key(segment_key)
    return all(segment.get(label, MISSING) == value for label, value in wanted.items())


@dataclass
class _View:
    first: int
    last: int
    # The segment values a row must have to count (`matches`), as a key and as a mapping.
    wanted: tuple[tuple[str, str], ...]
    admits: dict[str, str]
    # query -> summed row, over the buckets first..last of every partition and the wanted segments
    # (doubles in an array, as the rows are: `QueryIndex`).
    sums: dict[str, array[float]] = field(default_factory=dict)
    # Per cut-off, the nDCG's and the DCG's spread over the queries of `sums` as they were when
    # last settled (`QueryIndex.over_queries`).
    spreads: list[tuple[QuerySpread, QuerySpread]] = field(default_factory=list)
    # query -> its cells (`_cells`) as the spreads hold them, for the queries whose sums moved since:
    # a query re-credited by many rows between two requests moves the spreads once.
    unsettled: dict[str, list[tuple[float, float]] | None] = field(default_factory=dict)
    # segment key -> whether `admits` admits it (`matches` parses the key).
    admitted: dict[str, bool] = field(default_factory=dict)


class QueryIndex:
    """The rows of every bucket held, and running sums over the windows asked for.

    `put` replaces one row (rows are absolute: a store's log may repeat one);
    a window's sums are kept and moved along as later requests slide it, so a
    request costs what changed since the last, not what the window holds.

    The rows and the views' sums are arrays of doubles, not tuples or lists of floats: there is
    one per query, segment and bucket held (and per query in each view), so they grow with the
    event time held, and a float object each costs three times the double it holds. The same
    doubles, added in the same order: the figures are unchanged.
    """

    # Running windows kept: one per window and segment values for the exporter's figures over
    # queries (`over_queries`), and the windows of a page (with their previous ones) besides.
    MAX_VIEWS = 64
    # A view's queries left unsettled beyond those it holds before it settles them unasked: a view
    # only pages read (`window`) keeps at most this many more.
    UNSETTLED_BEYOND_HELD = 10_000

    def __init__(self, fields: Sequence[str], pace: Callable[[], None] = lambda: None) -> None:
        self.fields = tuple(fields)
        # Called between the steps of bringing a view's figures up to date (`query_figures.Pacer`).
        self.pace = pace
        self._buckets: dict[int, dict[RowKey, array[float]]] = {}
        # query -> the partitions holding a row of it (a query's state lives in its partitions).
        self._homes: dict[str, set[str]] = {}
        # query -> how many rows of it were put: what was read of its state is current while this is.
        self._versions: dict[str, int] = {}
        self._views: OrderedDict[tuple[int, int, tuple[tuple[str, str], ...]], _View] = OrderedDict()

    def put(self, partition: str, bucket: int, segment: str, query_id: str, row: Row) -> None:
        if len(row) != len(self.fields):
            raise ValueError(f"a row of {len(row)} values, not {len(self.fields)}: written by another configuration")
        rows = self._buckets.setdefault(bucket, {})
        self._homes.setdefault(query_id, set()).add(partition)
        self._versions[query_id] = self._versions.get(query_id, 0) + 1
        key = (partition, segment, query_id)
        old = rows.get(key)
        rows[key] = array("d", row)
        for view in self._views.values():
            if view.first <= bucket <= view.last:
                if old is not None:
                    self._move(view, segment, query_id, old, -1.0)
                self._move(view, segment, query_id, row, 1.0)

    def drop_partition(self, partition: str) -> None:
        """Forget every row of a partition (before reading it whole again)."""
        for rows in self._buckets.values():
            for key in [key for key in rows if key[0] == partition]:
                del rows[key]
        self._views.clear()
        self._find_homes()

    def drop_before(self, bucket: int) -> None:
        """Forget the buckets behind the horizon."""
        dropped = [b for b in self._buckets if b < bucket]
        for old in dropped:
            del self._buckets[old]
        if dropped:
            self._find_homes()
        # A view over a dropped bucket could no longer let it go as it slides.
        for key in [key for key, view in self._views.items() if view.first < bucket]:
            del self._views[key]

    def partitions_of(self, query_id: str) -> set[str]:
        return self._homes.get(query_id, set())

    def version(self, query_id: str) -> int:
        return self._versions.get(query_id, 0)

    def _find_homes(self) -> None:
        self._homes = {}
        for rows in self._buckets.values():
            for partition, _, query_id in rows:
                self._homes.setdefault(query_id, set()).add(partition)

    def window(self, first: int, last: int, wanted: SegmentFilter) -> dict[str, array[float]]:
        """The summed rows per query of buckets first..last and the segments `wanted` admits; do
        not modify them."""
        return self._view(first, last, wanted).sums

    def over_queries(self, first: int, last: int, wanted: SegmentFilter) -> list[dict[str, float | None]]:
        """Per cut-off, the figures of `window`'s queries: the query-clustered standard errors of
        the nDCG and DCG means and the query-averaged means (`spread.QuerySpread`)."""
        view = self._view(first, last, wanted)
        _settle(view, self.pace)
        out = []
        for ndcg, dcg in view.spreads:
            ndcg_error, ndcg_query_mean = ndcg.figures()
            dcg_error, dcg_query_mean = dcg.figures()
            out.append({"ndcg_clustered_standard_error": ndcg_error, "dcg_clustered_standard_error": dcg_error,
                        "ndcg_query_mean": ndcg_query_mean, "dcg_query_mean": dcg_query_mean,
                        "queries": float(dcg.queries)})
        return out

    def _view(self, first: int, last: int, wanted: SegmentFilter) -> _View:
        key = (first, last, tuple(sorted(wanted.items())))
        view = self._views.get(key)
        if view is None:
            view = self._slid_view(*key) or self._new_view(*key)
        self._views[key] = view
        self._views.move_to_end(key)
        while len(self._views) > self.MAX_VIEWS:
            self._views.popitem(last=False)
        return view

    def _slid_view(self, first: int, last: int, wanted: tuple[tuple[str, str], ...]) -> _View | None:
        """The nearest older view of the same length and segments, moved forward: what left it
        taken out, what entered it added (None if none is close enough to be cheaper than a new sum)."""
        length = last - first
        older = [v for v in self._views.values()
                 if v.wanted == wanted and v.last - v.first == length and first - length <= v.first < first]
        if not older:
            return None
        view = max(older, key=lambda v: v.first)
        del self._views[(view.first, view.last, view.wanted)]
        for bucket in range(view.first, first):
            self._add_bucket(view, bucket, -1.0)
        for bucket in range(max(view.last + 1, first), last + 1):
            self._add_bucket(view, bucket, 1.0)
        view.first, view.last = first, last
        return view

    def _new_view(self, first: int, last: int, wanted: tuple[tuple[str, str], ...]) -> _View:
        cutoffs = (len(self.fields) - 1) // len(FIGURES_PER_K)
        view = _View(first, last, wanted, dict(wanted),
                     spreads=[(QuerySpread(), QuerySpread()) for _ in range(cutoffs)])
        for bucket in range(first, last + 1):
            self._add_bucket(view, bucket, 1.0)
        return view

    def _add_bucket(self, view: _View, bucket: int, sign: float) -> None:
        for (_, segment, query_id), row in self._buckets.get(bucket, {}).items():
            self._move(view, segment, query_id, row, sign)

    def _move(self, view: _View, segment: str, query_id: str, row: Sequence[float], sign: float) -> None:
        if view.admits:
            admitted = view.admitted.get(segment)
            if admitted is None:
                admitted = view.admitted[segment] = matches(segment, view.admits)
            if not admitted:
                return
        total = view.sums.get(query_id)
        if query_id not in view.unsettled:
            if len(view.unsettled) > len(view.sums) + self.UNSETTLED_BEYOND_HELD:
                _settle(view, self.pace)
            view.unsettled[query_id] = None if total is None else _cells(total, len(view.spreads))
        if total is None:
            total = view.sums[query_id] = array("d", _ZERO) * len(row)
        add_into(total, row, sign)
        # Impressions are whole numbers, exact in a float: a row that left for good left nothing.
        if total[0] <= 0.0:
            del view.sums[query_id]


_ZERO = (0.0,)


def _settle(view: _View, pace: Callable[[], None]) -> None:
    """Move the view's spreads by what its queries' sums moved since they were last settled."""
    for query_id, before in view.unsettled.items():
        pace()
        total = view.sums.get(query_id)
        after = None if total is None else _cells(total, len(view.spreads))
        for i, (ndcg, dcg) in enumerate(view.spreads):
            ndcg.move(None if before is None else before[2 * i], None if after is None else after[2 * i])
            dcg.move(None if before is None else before[2 * i + 1], None if after is None else after[2 * i + 1])
    view.unsettled.clear()


def _cells(row: Sequence[float], cutoffs: int) -> list[tuple[float, float]]:
    """Per cut-off, a query's (scored impressions, nDCG sum) and (impressions, DCG sum)."""
    cells = []
    for i in range(cutoffs):
        cells += [(row[row_index(i, SCORED)], row[row_index(i, NDCG)]), (row[0], row[row_index(i, DCG)])]
    return cells


def figures(row: Sequence[float], cutoff_index: int) -> dict[str, float | None]:
    """A query's figures at one cut-off: impressions, scored impressions and the three means."""
    impressions, scored = row[0], row[row_index(cutoff_index, SCORED)]
    return {
        "impressions": impressions,
        "scored_impressions": scored,
        "ndcg": mean(row[row_index(cutoff_index, NDCG)], scored),
        "dcg": mean(row[row_index(cutoff_index, DCG)], impressions),
        "judged_ratio": mean(row[row_index(cutoff_index, JUDGED)], impressions),
    }


FIGURES = ("impressions", "scored_impressions", "ndcg", "dcg", "judged_ratio")
COMPARED = ("impressions", "ndcg", "dcg", "judged_ratio")
SORTS = ("query_id", *FIGURES, *(f"change_{name}" for name in COMPARED))


def record(query_id: str, row: Sequence[float], theirs: Sequence[float] | None, cutoff_index: int,
           compared: bool) -> dict[str, Any]:
    """One query's figures; when `compared`, the other side's (`theirs`, None where it has no
    impression) and the change from them (None where either side has no value)."""
    ours: dict[str, Any] = {"query_id": query_id, **figures(row, cutoff_index), "vs": None, "change": None}
    if compared:
        then = figures(theirs, cutoff_index) if theirs is not None else dict.fromkeys(FIGURES)
        ours["vs"] = then
        ours["change"] = {name: None if ours[name] is None or then[name] is None else ours[name] - then[name]
                          for name in COMPARED}
    return ours


def _sort_value(sort: str, table: Mapping[str, Sequence[float]], other: Mapping[str, Sequence[float]] | None,
                cutoff_index: int) -> Callable[[str], Any]:
    """What a query is sorted by, from its sums alone (no record is built for the queries not shown)."""
    if sort == "query_id":
        return lambda query_id: query_id
    name = sort.removeprefix("change_")
    position = {"impressions": 0, "scored_impressions": row_index(cutoff_index, SCORED),
                "ndcg": row_index(cutoff_index, NDCG),
                "dcg": row_index(cutoff_index, DCG), "judged_ratio": row_index(cutoff_index, JUDGED)}[name]
    denominator = {"ndcg": row_index(cutoff_index, SCORED), "dcg": 0, "judged_ratio": 0}.get(name)

    def figure(row: Sequence[float] | None) -> float | None:
        if row is None:
            return None
        if denominator is None:
            return row[position]
        return mean(row[position], row[denominator])

    if sort == name:
        return lambda query_id: figure(table[query_id])
    others = other or {}

    def change(query_id: str) -> float | None:
        now, then = figure(table[query_id]), figure(others.get(query_id))
        return None if now is None or then is None else now - then
    return change


def page(table: Mapping[str, Sequence[float]], other: Mapping[str, Sequence[float]] | None, cutoff_index: int, *,
         min_impressions: float, sort: str, descending: bool, offset: int,
         limit: int) -> tuple[int, list[dict[str, Any]]]:
    """The queries with at least `min_impressions`, sorted by `sort` (missing values last whatever
    the order, ties by query id), and the records of rows offset..offset+limit: (how many, records).
    Only the records shown are built: a window can hold a hundred thousand queries."""
    value = _sort_value(sort, table, other, cutoff_index)
    present: list[tuple[Any, str]] = []
    missing: list[str] = []
    for query_id, row in table.items():
        if row[0] >= min_impressions:
            held = value(query_id)
            if held is None:
                missing.append(query_id)
            else:
                present.append((held, query_id))
    wanted = offset + limit
    if sort == "query_id":
        chosen = sorted((query_id for _, query_id in present), reverse=descending)[:wanted]
    else:
        chosen = [query_id for _, query_id in heapq.nsmallest(
            wanted, present, key=(lambda item: (-item[0], item[1])) if descending else None)]
    if len(chosen) < wanted:
        chosen += sorted(missing)[:wanted - len(chosen)]
    shown = [record(query_id, table[query_id], (other or {}).get(query_id), cutoff_index, other is not None)
             for query_id in chosen[offset:]]
    return len(present) + len(missing), shown


def total_exposure(table: Mapping[str, Sequence[float]], cutoff_index: int) -> float:
    return math.fsum(row[row_index(cutoff_index, EXPOSURE)] for row in table.values())


def list_details(lists: Iterable[tuple[tuple[str, ...], str, int]], grades: Mapping[str, float],
                 measure: Measure, sources: Mapping[str, str]) -> list[dict[str, Any]]:
    """The distinct ranked lists of (list, segment key, impressions) entries, merged across
    buckets and segments, most shown first, each scored against the query's grades (each from
    the judgment source `sources` names)."""
    merged: dict[tuple[str, ...], dict[str, int]] = {}
    for ranked, segment, count in lists:
        by_segment = merged.setdefault(ranked, {})
        by_segment[segment] = by_segment.get(segment, 0) + count
    details: list[dict[str, Any]] = []
    for ranked, by_segment in merged.items():
        score = score_list(ranked, grades, measure)
        own = [measure.gain_of(grades[doc]) for _, doc in first_occurrences(ranked, measure.depth) if doc in grades]
        details.append({
            "impressions": sum(by_segment.values()),
            "segments": [{"segment": dict(parse_segment_key(s)), "impressions": n}
                         for s, n in sorted(by_segment.items())],
            "results": [{"rank": rank, "doc_id": doc, "grade": grades.get(doc), "source": sources.get(doc)}
                        for rank, doc in enumerate(ranked, start=1)],
            "dcg": {str(k): score.dcg[k] for k in measure.cutoffs},
            "ndcg": {str(k): score.ndcg[k] for k in measure.cutoffs},
            "ideal_dcg": {str(k): ideal_dcg([measure.gain_of(g) for g in grades.values()]
                                            if measure.ideal == "pool" else own, k) for k in measure.cutoffs},
        })
    details.sort(key=lambda d: (-int(d["impressions"]), [r["doc_id"] for r in d["results"]]))
    return details
