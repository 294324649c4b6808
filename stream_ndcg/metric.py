"""The metric: gains, discounts, DCG@k, ideal DCG, nDCG@k and judged ratio@k, and their sums.

Standard library only (and the package's names, `vocabulary`). Everything the
service reports is one of these functions applied to a ranked list and the
judgments known for its query, summed over impressions into the aggregate
fields by `list_sums` (lists scored one by one) or `pooled_sums` (many lists at
once, from where their judged documents stand). Those two are the sums' definitions
from scratch: the engine keeps the same sums as a group changes (`list_terms`,
`group_sums`), and the tests hold what it keeps to them, bit for bit.

    >>> measure = Measure(cutoffs=(6,), gain="linear", ideal="list")
    >>> score = score_list(["D1", "D2", "D3", "D4", "D5", "D6"],
    ...                    {"D1": 3, "D2": 2, "D3": 3, "D4": 0, "D5": 1, "D6": 2}, measure)
    >>> round(score.dcg[6], 3), round(score.ndcg[6] or 0.0, 3)
    (6.861, 0.961)

Definitions (the documents the project started from; their worked examples are the test vectors
of tests/unit/test_metric.py):
- rank r starts at 1; discount(r) = 1 / log2(r + 1).
- gain: ``exponential`` 2**grade - 1, ``linear`` grade.
- DCG@k sums gain * discount over the first k ranks. An unjudged document has
  gain 0 and keeps its rank; a document repeated in one list counts only at
  its first rank; ranks past the end of a short list count as gain 0.
- ideal DCG@k: the k largest positive gains, sorted, discounted. ``pool``
  takes them from every judgment known for the query (shown or not), ``list``
  from the list's own judged documents. Negative gains never enter the ideal.
- nDCG@k = DCG@k / ideal DCG@k, and None when the ideal DCG is 0. In sums an
  undefined nDCG adds nothing, neither to the nDCG sum nor to the scored
  impressions (`ndcg_sums`): it is left out of the nDCG mean, not counted as 0.
- judged ratio@k: the share of the k top ranks that hold a judged document.
"""

from __future__ import annotations

import heapq
import math
import operator
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Literal, NamedTuple

from stream_ndcg.vocabulary import (
    DEFAULT_JUDGMENT_SOURCES,
    SOURCE_NAME,
    SOURCE_RULE,
    dcg_at,
    dcg_squares_at,
    judged_at,
    ndcg_at,
    ndcg_squares_at,
    scored_at,
)

Gain = Literal["exponential", "linear"]
Ideal = Literal["pool", "list"]
GAINS: tuple[Gain, ...] = ("exponential", "linear")
IDEALS: tuple[Ideal, ...] = ("pool", "list")
DEFAULT_CUTOFFS: tuple[int, ...] = (5, 10)
DEFAULT_GAIN: Gain = "exponential"
DEFAULT_IDEAL: Ideal = "pool"

# 2**100 is far beyond any grading scale and keeps every sum finite.
MAX_ABS_GRADE = 100.0
# The smallest |grade| but 0. An nDCG is a DCG over an ideal: over an ideal made of tinier grades
# alone, a list's negative DCG overflows to -inf, which no sum can hold.
MIN_ABS_GRADE = 1e-100


@dataclass(frozen=True)
class Measure:
    """nDCG@k declared once: the cut-offs, the gain formula, the ideal ordering, and the judgment
    sources whose grades count, first first: a document's grade is that of the first source in
    `sources` that grades it (`query_state.effective_grade`)."""

    cutoffs: tuple[int, ...] = DEFAULT_CUTOFFS
    gain: Gain = DEFAULT_GAIN
    ideal: Ideal = DEFAULT_IDEAL
    sources: tuple[str, ...] = DEFAULT_JUDGMENT_SOURCES

    def __post_init__(self) -> None:
        if not self.cutoffs:
            raise ValueError("at least one cut-off k is needed")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.cutoffs):
            raise ValueError(f"cut-offs must be positive integers, got {self.cutoffs!r}")
        if len(set(self.cutoffs)) != len(self.cutoffs):
            raise ValueError(f"cut-offs must be distinct, got {self.cutoffs!r}")
        if self.gain not in GAINS:
            raise ValueError(f"gain must be one of {GAINS}, got {self.gain!r}")
        if self.ideal not in IDEALS:
            raise ValueError(f"ideal must be one of {IDEALS}, got {self.ideal!r}")
        if not self.sources or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"judgment sources must be at least one, each once, got {self.sources!r}")
        if not all(isinstance(s, str) and SOURCE_NAME.fullmatch(s) for s in self.sources):
            raise ValueError(f"a judgment source is {SOURCE_RULE}, got {self.sources!r}")

    @property
    def depth(self) -> int:
        """The deepest rank any cut-off looks at."""
        return max(self.cutoffs)

    def gain_of(self, grade: float) -> float:
        return gain(grade, self.gain)


def gain(grade: float, formula: Gain) -> float:
    """The gain of one judged document."""
    if formula == "exponential":
        return math.pow(2.0, grade) - 1.0
    return float(grade)


_DISCOUNTS: list[float] = [0.0]
# The engine and the drill-down API's threads share the table: two growing it at once could
# each append the value of one rank, and the second would sit at the next rank.
_DISCOUNTS_GROWING = threading.Lock()


def discount(rank: int) -> float:
    """1 / log2(rank + 1), rank counted from 1 (cached: it is on every hot path)."""
    if rank >= len(_DISCOUNTS):
        with _DISCOUNTS_GROWING:
            while len(_DISCOUNTS) <= rank:
                _DISCOUNTS.append(1.0 / math.log2(len(_DISCOUNTS) + 1))
    return _DISCOUNTS[rank]


def discounted(gain_value: float, rank: int) -> float:
    """What a gain at `rank` adds to a DCG."""
    return gain_value * discount(rank)


def cumulative_gain(gains: Iterable[float]) -> float:
    """CG: the plain sum of the gains, blind to their order."""
    return math.fsum(gains)


def dcg(gains: Sequence[float], k: int) -> float:
    """DCG@k of gains listed in rank order."""
    return math.fsum(discounted(g, rank) for rank, g in enumerate(gains[:k], start=1) if g)


def ideal_dcg(gains: Iterable[float], k: int) -> float:
    """Ideal DCG@k: the k largest positive gains, best first."""
    best = heapq.nlargest(k, (g for g in gains if g > 0.0))
    return math.fsum(discounted(g, rank) for rank, g in enumerate(best, start=1))


def ndcg(dcg_value: float, ideal_value: float) -> float | None:
    """nDCG, or None where the ideal DCG is 0 and the ratio means nothing."""
    return dcg_value / ideal_value if ideal_value > 0.0 else None


def first_occurrences(results: Sequence[str], depth: int) -> list[tuple[int, str]]:
    """(rank, doc) of the first `depth` ranks, dropping repeats of a document."""
    top = results[:depth]
    if len(set(top)) == len(top):
        # The usual list repeats nothing.
        return list(enumerate(top, start=1))
    seen: set[str] = set()
    ranked: list[tuple[int, str]] = []
    for rank, doc in enumerate(top, start=1):
        if doc not in seen:
            seen.add(doc)
            ranked.append((rank, doc))
    return ranked


class ListScore(NamedTuple):
    """DCG, nDCG (None when undefined) and judged ratio of one list, by cut-off (a named tuple, like
    the events: one object to build and collect, not two)."""

    dcg: dict[int, float]
    ndcg: dict[int, float | None]
    judged_ratio: dict[int, float]


def score_list(
    results: Sequence[str],
    grades: Mapping[str, float],
    measure: Measure,
) -> ListScore:
    """Score one ranked list against the judgments of its query, from scratch.

    `grades` holds every current judgment of the query; with the pool ideal the
    judged documents that the list does not show still raise its ideal DCG.
    """
    ranked = first_occurrences(results, measure.depth)
    gains_by_rank = [0.0] * min(len(results), measure.depth)
    judged_ranks: list[int] = []
    for rank, doc in ranked:
        grade = grades.get(doc)
        if grade is not None:
            gains_by_rank[rank - 1] = measure.gain_of(grade)
            judged_ranks.append(rank)
    if measure.ideal == "pool":
        ideal_pool = [measure.gain_of(g) for g in grades.values()]
    else:
        ideal_pool = [measure.gain_of(grades[doc]) for _, doc in ranked if doc in grades]
    dcgs: dict[int, float] = {}
    ndcgs: dict[int, float | None] = {}
    judged: dict[int, float] = {}
    for k in measure.cutoffs:
        dcgs[k] = dcg(gains_by_rank, k)
        ndcgs[k] = ndcg(dcgs[k], ideal_dcg(ideal_pool, k))
        judged[k] = sum(1 for rank in judged_ranks if rank <= k) / k
    return ListScore(dcg=dcgs, ndcg=ndcgs, judged_ratio=judged)


class ListScorer:
    """`score_list` of many lists of one query: the gains, and the pool ideal's DCGs, are found
    once, and a list's terms by the interpreter's own loops (a third of `score_list`'s time a list
    on the replay bench's impressions). For the replay, which scores every impression; `score_list`
    stays the definition written out, which the tests hold this to, bit for bit."""

    def __init__(self, grades: Mapping[str, float], measure: Measure) -> None:
        self.measure = measure
        # Keyed by str | None: `score` looks up None at a repeat's later ranks, and finds no gain.
        self.gains: dict[str | None, float] = {doc: measure.gain_of(grade) for doc, grade in grades.items()}
        self.pool_ideals = ({k: ideal_dcg(self.gains.values(), k) for k in measure.cutoffs}
                            if measure.ideal == "pool" else None)
        # From rank 1 down to the deepest cut-off.
        self.discounts = [discount(rank) for rank in range(1, measure.depth + 1)]

    def score(self, results: Sequence[str]) -> ListScore:
        cutoffs = self.measure.cutoffs
        top: Sequence[str | None] = results[:self.measure.depth]
        if len(set(top)) != len(top):
            # A repeat counts only at its first rank: unjudged at the others.
            top = [None if doc in top[:rank] else doc for rank, doc in enumerate(top)]
        # By rank from 1: whether the document there is judged, its gain (0 if not) and what it adds
        # to a DCG (each found in one pass of the interpreter's own loops).
        judged = list(map(self.gains.__contains__, top))
        gains = list(map(self.gains.get, top, repeat(0.0)))
        terms = list(map(operator.mul, gains, self.discounts))
        ideals = self.pool_ideals
        if ideals is None:
            shown = list(compress(gains, judged))
            ideals = {k: ideal_dcg(shown, k) for k in cutoffs}
        dcgs: dict[int, float] = {}
        ndcgs: dict[int, float | None] = {}
        judged_ratios: dict[int, float] = {}
        for k in cutoffs:
            # fsum rounds the exact sum, which zero terms leave as it is; `or` makes a zero
            # positive, as the definition's sum of the nonzero terms alone is.
            dcgs[k] = value = math.fsum(terms[:k]) or 0.0
            ndcgs[k] = ndcg(value, ideals[k])
            judged_ratios[k] = sum(judged[:k]) / k
        return ListScore(dcg=dcgs, ndcg=ndcgs, judged_ratio=judged_ratios)


def ndcg_sums(ndcgs: Iterable[tuple[float | None, int]]) -> tuple[float, float]:
    """The nDCG sum and the scored impressions of (nDCG summed over n impressions, n) pairs.

    The one convention for an undefined nDCG (None): it adds to neither.
    """
    defined = [(value, n) for value, n in ndcgs if value is not None]
    return math.fsum(value for value, _ in defined), float(sum(n for _, n in defined))


def list_sums(scores: Iterable[tuple[ListScore, int]], cutoffs: Iterable[int]) -> dict[str, float]:
    """The aggregate fields of lists scored one by one, each shown `count` times: DCG, nDCG,
    scored impressions and judged ratio, and the squares of DCG and nDCG, summed per cut-off."""
    shown = list(scores)
    sums: dict[str, float] = {}
    for k in cutoffs:
        sums[dcg_at(k)] = math.fsum(score.dcg[k] * count for score, count in shown)
        sums[dcg_squares_at(k)] = math.fsum(score.dcg[k] * score.dcg[k] * count for score, count in shown)
        sums[ndcg_at(k)], sums[scored_at(k)] = ndcg_sums(
            (None if (value := score.ndcg[k]) is None else value * count, count) for score, count in shown)
        sums[ndcg_squares_at(k)] = math.fsum(value * value * count for score, count in shown
                                             if (value := score.ndcg[k]) is not None)
        sums[judged_at(k)] = math.fsum(score.judged_ratio[k] * count for score, count in shown)
    return sums


def pooled_sums(
    judged: Iterable[tuple[float, Mapping[int, int]]],
    impressions: int,
    ideals: Mapping[int, float],
    squares: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The aggregate fields of `impressions` lists that share the pool ideal (`ideals`: ideal DCG
    by cut-off), from where their judged documents stand: per document, its gain and
    {first rank: lists showing it there}. The sums of `score_list` list by list, at the cost of
    the judged documents rather than of the lists; with their DCGs' `squares`
    (`list_squares.ListSquares`), their nDCGs' too."""
    deepest = max(ideals, default=0)
    discount(deepest)
    discounts = _DISCOUNTS
    # (rank, term, lists) of every place a judged document is shown within the cut-offs. fsum
    # rounds the exact sum once, so the terms may be gathered in any order: one pass, then one
    # filter per cut-off.
    shown = [(rank, gain_value * count * discounts[rank], count)
             for gain_value, at in judged for rank, count in at.items() if rank <= deepest]
    dcgs: list[float] = []
    judged_counts: list[int] = []
    for k in ideals:
        within = [(term, count) for rank, term, count in shown if rank <= k]
        dcgs.append(math.fsum([term for term, _ in within]))
        judged_counts.append(sum([count for _, count in within]))
    return pooled_totals(tuple(ideals), dcgs, judged_counts, impressions, dict(ideals), squares)


# Per cut-off, the names of the pooled figures (`pooled_names`), each made once.
_POOLED_NAMES: dict[int, tuple[str, str, str, str, str, str]] = {}


def pooled_names(k: int) -> tuple[str, str, str, str, str, str]:
    """The names of the sums of DCG, judged ratio, nDCG, scored impressions, DCG squares and nDCG
    squares at cut-off `k`: looked up, not formatted again for every group re-credited."""
    names = _POOLED_NAMES.get(k)
    if names is None:
        names = _POOLED_NAMES[k] = (dcg_at(k), judged_at(k), ndcg_at(k), scored_at(k), dcg_squares_at(k),
                                    ndcg_squares_at(k))
    return names


def pooled_totals(
    cutoffs: tuple[int, ...],
    dcgs: list[float],
    judged: list[int],
    impressions: int,
    ideals: dict[int, float],
    squares: Mapping[str, float] | None = None,
    sums: dict[str, float] | None = None,
) -> dict[str, float]:
    """The aggregate fields of `impressions` lists sharing the pool ideal, from their DCG sums and
    the impressions of judged documents within each of the `cutoffs`, in their order (what
    `pooled_sums` finds from where they stand, and `group_sums` keeps); added to `sums` if given."""
    if sums is None:
        sums = {}
    for i in range(len(cutoffs)):
        k = cutoffs[i]
        names = pooled_names(k)
        sums[names[0]] = dcgs[i]
        sums[names[1]] = judged[i] / k
    if squares:
        sums.update(squares)
    return pooled_ndcg(sums, impressions, ideals)


def pooled_ndcg(sums: dict[str, float], impressions: int, ideals: dict[int, float]) -> dict[str, float]:
    """Set the nDCG sums from the DCG sums of `impressions` lists sharing the pool ideal: the sum
    of their nDCG is the sum of their DCG over it, and of their squares the DCG's squares over its
    square (where those are known). An undefined nDCG adds to neither sum (`ndcg_sums`)."""
    for k, ideal in ideals.items():
        names = pooled_names(k)
        if ideal > 0.0:
            # `ndcg_sums` of the one value: its fsum, the value itself with a negative zero made positive.
            sums[names[2]] = sums[names[0]] / ideal + 0.0
            sums[names[3]] = float(impressions)
        else:
            sums[names[2]] = sums[names[3]] = 0.0
        squares = sums.get(names[4])
        if squares is not None:
            sums[names[5]] = squares / (ideal * ideal) if ideal > 0.0 else 0.0
    return sums
