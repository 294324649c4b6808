"""The judging queue: the unjudged (query, document) pairs that would move the most impressions.

Standard library only. It ranks unjudged pairs by their top-k exposure over the window (1 /
log2(rank + 1) at a document's first rank, if that is <= k), as a share of all the window's
top-k exposure: the judgments that would move the most impressions from unjudged to judged.
Its search is exact and reads only the queries that can still make the list: the summed
exposure of each group's top unjudged document bounds every pair of a query.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from stream_ndcg.drilldown.index import SegmentFilter, matches
from stream_ndcg.metric import discount
from stream_ndcg.query_state import QueryState
from stream_ndcg.rows import UNJUDGED, UNJUDGED_TOP, row_index


@dataclass(frozen=True)
class Pair:
    """An unjudged (query, document) pair of the judging queue."""

    query_id: str
    doc_id: str
    exposure: float
    best_rank: int


# (bucket, segment) -> unjudged doc -> (its exposure in the group, its best rank there).
GroupExposures = dict[tuple[int, str], dict[str, tuple[float, int]]]


def unjudged_exposures(state: QueryState, k: int, sources: tuple[str, ...]) -> GroupExposures:
    """Each group's documents no source of `sources` grades, with their top-k exposure in it: what
    the judging queue needs of a query's state (and keeps while the query's rows do not change)."""
    grades = state.grades(sources)
    groups: GroupExposures = {}
    for key, group in state.groups.items():
        docs: dict[str, tuple[float, int]] = {}
        for doc, at in group.ranks.items():
            if doc in grades:
                continue
            shown = [(rank, count) for rank, count in at.items() if rank <= k]
            if shown:
                docs[doc] = (math.fsum(count * discount(rank) for rank, count in shown), min(r for r, _ in shown))
        if docs:
            groups[key] = docs
    return groups


def pairs_in(groups: GroupExposures, first: int, last: int, wanted: SegmentFilter) -> dict[str, Pair]:
    """The exposure of each unjudged document over the groups of buckets first..last that `wanted` admits."""
    parts: dict[str, list[float]] = {}
    best: dict[str, int] = {}
    for (bucket, segment), docs in groups.items():
        if first <= bucket <= last and matches(segment, wanted):
            for doc, (exposure, rank) in docs.items():
                parts.setdefault(doc, []).append(exposure)
                best[doc] = min(best.get(doc, rank), rank)
    return {doc: Pair("", doc, math.fsum(values), best[doc]) for doc, values in parts.items()}


def judging_queue(
    table: Mapping[str, Sequence[float]],
    cutoff_index: int,
    limit: int,
    pairs_of: Callable[[list[str]], Mapping[str, Mapping[str, Pair]]],
) -> list[Pair]:
    """The `limit` unjudged pairs of most exposure, exposure descending, ties by query then document.

    `pairs_of(query_ids)` gives each query's unjudged pairs (it reads their states: the cost).
    Queries are read in order of a bound on their pairs, in growing chunks, and the search stops
    at the first query that cannot beat the pairs held.
    """
    unjudged = row_index(cutoff_index, UNJUDGED)
    # A pair holds, in each group, at most what the group's top unjudged document holds: summed,
    # a bound of the pair's exposure in the window (and never more than 1 per impression).
    top = row_index(cutoff_index, UNJUDGED_TOP)
    waiting = [(-min(row[top], row[0]), query_id) for query_id, row in table.items() if row[unjudged] > 0.0]
    heapq.heapify(waiting)
    held: list[tuple[float, str, str, Pair]] = []  # a min-heap on (exposure, reversed tie order)

    def beaten() -> bool:
        # Strictly below: a pair equal to the least held could still win on the tie order.
        return len(held) >= limit and -waiting[0][0] < held[0][0]

    chunk = 16
    while waiting and not beaten():
        queries: list[str] = []
        while waiting and len(queries) < chunk and not beaten():
            queries.append(heapq.heappop(waiting)[1])
        chunk = min(4 * chunk, 1024)
        for query_id, pairs in pairs_of(queries).items():
            for pair in pairs.values():
                item = (pair.exposure, _reverse(query_id), _reverse(pair.doc_id),
                        Pair(query_id, pair.doc_id, pair.exposure, pair.best_rank))
                if len(held) < limit:
                    heapq.heappush(held, item)
                elif item[:3] > held[0][:3]:
                    heapq.heapreplace(held, item)
    return [item[3] for item in sorted(held, key=lambda item: item[:3], reverse=True)]


def _reverse(text: str) -> str:
    """A key that orders strings backwards, so the min-heap drops the last in (query, doc) order first."""
    return "".join(chr(0x10FFFF - ord(c)) for c in text) + "\U0010ffff"
