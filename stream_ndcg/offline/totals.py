"""The replay's sums of scored impressions, and the means, errors and query figures they give.

Standard library only. `ScoreTotals` gathers what `metric.list_sums` sums, list by list, and per
query its impressions and sums: the replay's summary reports from it what the service reports
of a window (`windows.means`, `drilldown.index.QueryIndex.over_queries`), each computed afresh.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from stream_ndcg.comparisons import clustered_standard_error, query_mean
from stream_ndcg.drilldown.compare import Arm
from stream_ndcg.metric import ListScore, ndcg_sums
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    MOMENTS,
    dcg_at,
    dcg_squares_at,
    judged_at,
    ndcg_at,
    ndcg_squares_at,
    scored_at,
)
from stream_ndcg.windows import means

# What the summary reports per cut-off of `windows.means`, and from the queries' sums.
REPORTED = ("ndcg_mean", "ndcg_standard_error", "dcg_mean", "dcg_standard_error", "judged_ratio")
OVER_QUERIES = ("ndcg_clustered_standard_error", "dcg_clustered_standard_error", "ndcg_query_mean", "dcg_query_mean",
                "queries")


class ScoreTotals:
    """The aggregate fields of lists scored one by one (`metric.list_sums`, each list shown once),
    gathered as they come: only their terms are kept, as floats, for `math.fsum`, rather than
    every score."""

    def __init__(self, cutoffs: tuple[int, ...], scores: Iterable[ListScore] = ()) -> None:
        self.cutoffs = cutoffs
        self.impressions = 0
        # query -> [impressions, then per cut-off its scored impressions, nDCG sum and DCG sum]:
        # of the impressions added with their query.
        self._queries: dict[str, list[float]] = {}
        # Per cut-off: every DCG, every defined nDCG, every judged ratio.
        self._terms: dict[int, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in cutoffs}
        for score in scores:
            self.add(score)

    def add(self, score: ListScore, query_id: str | None = None) -> None:
        self.impressions += 1
        if query_id is not None:
            held = self._queries.get(query_id)
            if held is None:
                held = self._queries[query_id] = [0.0] * (1 + 3 * len(self.cutoffs))
            held[0] += 1
            for i, k in enumerate(self.cutoffs):
                value = score.ndcg[k]
                if value is not None:
                    held[1 + 3 * i] += 1
                    held[2 + 3 * i] += value
                held[3 + 3 * i] += score.dcg[k]
        for k, (dcgs, ndcgs, judged) in self._terms.items():
            dcgs.append(score.dcg[k])
            value = score.ndcg[k]
            if value is not None:
                ndcgs.append(value)
            judged.append(score.judged_ratio[k])

    def sums(self) -> dict[str, float]:
        sums = {IMPRESSIONS: float(self.impressions), MOMENTS: float(self.impressions)}
        for k, (dcgs, ndcgs, judged) in self._terms.items():
            sums[dcg_at(k)] = math.fsum(dcgs)
            sums[dcg_squares_at(k)] = math.fsum(value * value for value in dcgs)
            sums[ndcg_at(k)], sums[scored_at(k)] = ndcg_sums((value, 1) for value in ndcgs)
            sums[ndcg_squares_at(k)] = math.fsum(value * value for value in ndcgs)
            sums[judged_at(k)] = math.fsum(judged)
        return sums

    def means(self) -> dict[str, dict[str, Any]]:
        """Means per cut-off: nDCG over scored impressions, DCG and judged ratio over all (the
        service's window means, over every impression)."""
        sums = self.sums()
        rows = means(sums, self.cutoffs)
        return {str(k): {**{name: rows[str(k)][name] for name in REPORTED}, **self._over_queries(i),
                         "scored_impressions": int(sums[scored_at(k)]), "impressions": self.impressions}
                for i, k in enumerate(self.cutoffs)}

    def arm(self, cutoff_index: int) -> Arm:
        """The impressions added as one arm of a comparison (`drilldown.compare`), at one cut-off."""
        k = self.cutoffs[cutoff_index]
        sums = self.sums()
        return Arm((sums[scored_at(k)], sums[ndcg_at(k)], sums[ndcg_squares_at(k)]),
                   {query: (held[1 + 3 * cutoff_index], held[2 + 3 * cutoff_index])
                    for query, held in self._queries.items()})

    def _over_queries(self, cutoff_index: int) -> dict[str, Any]:
        """The figures over the queries of the impressions added with theirs (computed afresh:
        `comparisons.clustered_mean` and `comparisons.query_mean`)."""
        ndcg = [(held[1 + 3 * cutoff_index], held[2 + 3 * cutoff_index]) for held in self._queries.values()]
        dcg = [(held[0], held[3 + 3 * cutoff_index]) for held in self._queries.values()]
        return {"ndcg_clustered_standard_error": clustered_standard_error(ndcg),
                "dcg_clustered_standard_error": clustered_standard_error(dcg),
                "ndcg_query_mean": query_mean(ndcg), "dcg_query_mean": query_mean(dcg), "queries": len(dcg)}
