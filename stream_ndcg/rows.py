"""The drill-down row: what one group of impressions adds to a window, per query.

Pure, standard library only. The engine writes one *row* per group it re-credits: the sums a
group (one query, one time bucket, one segment) adds to the window means, in the order of
`row_fields`, plus the top-k exposure it gives documents, judged or not. The replay computes
the same rows impression by impression (`impression_row`), which is what the tests compare.

Exposure of a document in one impression: 1 / log2(rank + 1) at its first rank, if that is <= k.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, MutableSequence, Sequence

from stream_ndcg.metric import ListScore, Measure, discount, first_occurrences
from stream_ndcg.query_state import Group
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    dcg_at,
    exposure_at,
    judged_at,
    ndcg_at,
    scored_at,
    unjudged_at,
    unjudged_top_at,
)

Row = tuple[float, ...]
FIGURES_PER_K = (ndcg_at, dcg_at, scored_at, judged_at, exposure_at, unjudged_at, unjudged_top_at)
# Where each figure of cut-off number i sits in a row.
NDCG, DCG, SCORED, JUDGED, EXPOSURE, UNJUDGED, UNJUDGED_TOP = range(len(FIGURES_PER_K))


def row_fields(cutoffs: Sequence[int]) -> tuple[str, ...]:
    """The names of a row's values, in order: impressions, then seven per cut-off."""
    return (IMPRESSIONS, *(name(k) for k in cutoffs for name in FIGURES_PER_K))


def row_index(cutoff_index: int, figure: int) -> int:
    """Where figure `figure` (`NDCG` ... `UNJUDGED_TOP`) of cut-off number `cutoff_index` sits in a row."""
    return 1 + len(FIGURES_PER_K) * cutoff_index + figure


def group_row(group: Group, grades: Mapping[str, float], cutoffs: Sequence[int]) -> Row:
    """A group's row: what it credited to the aggregates, and its exposure ({doc: {first rank:
    impressions}} discounted, at each cut-off), the part of it unjudged documents hold, and the
    most one unjudged document holds."""
    exposure = group.exposure(grades, tuple(cutoffs))
    values = [float(group.impressions)]
    credited = group.credited
    for i, names in enumerate(_credited_names(tuple(cutoffs))):
        values += [credited.get(name, 0.0) for name in names]
        values += exposure[3 * i:3 * i + 3]
    return tuple(values)


@functools.cache
def _credited_names(cutoffs: tuple[int, ...]) -> tuple[tuple[str, ...], ...]:
    """Per cut-off, the names of the credited figures a row starts with."""
    return tuple(tuple(name(k) for name in FIGURES_PER_K[:EXPOSURE]) for k in cutoffs)


def impression_row(results: Sequence[str], score: ListScore, grades: Mapping[str, float],
                   measure: Measure) -> Row:
    """One impression's row, from its list scored from scratch (the replay's side). Its
    `unjudged_top_at` is 0: that figure is one of a group, not of an impression (`group_tops`)."""
    ranked = first_occurrences(results, measure.depth)
    values = [1.0]
    for k in measure.cutoffs:
        ndcg = score.ndcg[k]
        exposure = math.fsum(discount(rank) for rank, _ in ranked if rank <= k)
        unjudged = math.fsum(discount(rank) for rank, doc in ranked if rank <= k and doc not in grades)
        values += [ndcg or 0.0, score.dcg[k], 0.0 if ndcg is None else 1.0, score.judged_ratio[k], exposure, unjudged,
                   0.0]
    return tuple(values)


def group_tops(impressions: Iterable[Sequence[str]], grades: Mapping[str, float],
               cutoffs: Sequence[int]) -> list[tuple[int, float]]:
    """(row position, value) of the `unjudged_top_at` figures of one group, from its impressions'
    lists: each unjudged document's exposure summed over the group, the largest per cut-off."""
    held: dict[str, list[float]] = {}
    for results in impressions:
        for rank, doc in first_occurrences(results, max(cutoffs)):
            if doc not in grades:
                sums = held.setdefault(doc, [0.0] * len(cutoffs))
                for i, k in enumerate(cutoffs):
                    if rank <= k:
                        sums[i] += discount(rank)
    return [(row_index(i, UNJUDGED_TOP), max((sums[i] for sums in held.values()), default=0.0))
            for i in range(len(cutoffs))]


def add_into(total: MutableSequence[float], row: Sequence[float], sign: float = 1.0) -> None:
    for i, value in enumerate(row):
        total[i] += sign * value
