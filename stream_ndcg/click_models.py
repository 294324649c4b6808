"""The click models: integer counts by time bucket, and the scores and grades they give.

Pure: standard library only. `ClickCounts` keeps, per time bucket of the
impressions' own times, the counts of the impressions whose clicks are final
(`click_sessions.FinalImpression`): per rank, how many impressions had a
result there and how many of those were clicked; per (query, document), its
impressions by the rank it was shown at, its clicks, and the cascade counts.
Every figure is an integer sum over buckets, so forgetting a bucket that
falls behind the horizon is exact, and the rank counts of several partitions
(`RankCounts`) add up to those of one.

Only the first `max_rank` results of an impression count, at the first
position of each document, for both models.

**COEC** (clicks over expected clicks; Zhang and Jones 2007), the default.
CTR(r) = clicks at rank r / impressions with a result at rank r, over all
queries of the horizon. For a pair, expected clicks E = the sum over its
impressions of CTR at the rank it was shown there, clicks C = the impressions
on which it was clicked; score = C / E (1: as clicked as an average result at
its ranks; 0 when C = 0). OpenSearch's Search Relevance Workbench computes
clicks / (CTR at the pair's best rank x impressions): a document shown at rank 1
once and at rank 5 a hundred times is expected there to be clicked as often as a
rank-1 result every time, and so looks worse than it is; summing per impression
gives each impression the CTR of its own rank.

**SDBN** (simplified dynamic Bayesian network, fitted by counting as PyClick's
`SDBN` does). The last click of an impression is its deepest clicked rank;
every result at or above it was examined; with no click, every result up to
`max_rank` was (PyClick's convention). Per pair: examinations, clicks (each
click is on an examined result), last clicks (the clicks that were an
impression's last). attractiveness = (clicks + 1) / (examinations + 2),
satisfaction = (last clicks + 1) / (clicks + 2), score = attractiveness x
satisfaction. The prior is PyClick's: its `ParamMLE` counters start at 1/2, a
Beta(1, 1) prior, so an unexamined pair scores 1/2 x 1/2 = 1/4 and a pair's
figures can be checked against PyClick's.

**Grades**: a pair with fewer than `min_impressions` impressions in the horizon
has none (it is retracted: grade null); otherwise its score is graded by three
thresholds (< t1: 0, < t2: 1, < t3: 2, else 3) or, with `grade = "score"`, the
score itself (rounded to 3 decimals, as the Workbench reports it, so that a
ripple of CTR does not re-grade every pair; at most `metric.MAX_ABS_GRADE`).
Scores are exact fractions of the integer counts, so a score exactly at a
threshold is graded as being at it, whatever the order of the sums; the
evidence gives expected clicks as the nearest float.

    counts = ClickCounts(max_rank=20)
    counts.add(final_impression, bucket=final_impression.ts // 86_400_000)
    ctr = counts.rank_counts(since=oldest)      # summed with other partitions' for COEC
    changed = counts.changes(Grading("coec", 20), ctr, since=oldest, previous={})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from stream_ndcg.click_sessions import FinalImpression
from stream_ndcg.metric import MAX_ABS_GRADE

Model = Literal["coec", "sdbn"]
MODELS: tuple[Model, ...] = ("coec", "sdbn")
DEFAULT_THRESHOLDS: dict[str, tuple[float, float, float]] = {"coec": (0.5, 1.0, 2.0), "sdbn": (0.1, 0.3, 0.6)}
# PyClick's prior: every counter starts at 1/2.
PRIOR_NUMERATOR = 1
PRIOR_DENOMINATOR = 2
SCORE_DECIMALS = 3

Pair = tuple[str, str]
Evidence = tuple[tuple[str, int | float], ...]


@dataclass
class RankCounts:
    """Per rank (index 0 is rank 1): impressions with a result there, and clicks on it."""

    shown: list[int]
    clicked: list[int]

    @classmethod
    def empty(cls, max_rank: int) -> RankCounts:
        return cls([0] * max_rank, [0] * max_rank)

    def add(self, other: RankCounts) -> None:
        """Add `other`'s counts (another bucket's, or another partition's)."""
        for counts, more in ((self.shown, other.shown), (self.clicked, other.clicked)):
            for index, value in enumerate(more):
                counts[index] += value

    def rates(self) -> list[Fraction]:
        """CTR by rank (index 0 is rank 1): clicks over impressions there, 0 where none was shown."""
        return [Fraction(clicked, shown) if shown else Fraction(0) for shown, clicked in zip(self.shown, self.clicked,
                                                                                              strict=True)]


@dataclass
class PairCounts:
    """One (query, document) pair's counts in one bucket."""

    impressions: int = 0
    clicks: int = 0
    # rank -> impressions that showed the document there.
    by_rank: dict[int, int] = field(default_factory=dict)
    examinations: int = 0
    last_clicks: int = 0

    def add(self, other: PairCounts) -> None:
        self.impressions += other.impressions
        self.clicks += other.clicks
        for rank, n in other.by_rank.items():
            self.by_rank[rank] = self.by_rank.get(rank, 0) + n
        self.examinations += other.examinations
        self.last_clicks += other.last_clicks


@dataclass(frozen=True)
class Grading:
    """How a pair's counts become a grade: the model, the minimum of impressions, and the
    thresholds (None: the model's defaults) or the score itself (`grade = "score"`)."""

    model: Model = "coec"
    min_impressions: int = 20
    grade: Literal["thresholds", "score"] = "thresholds"
    thresholds: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}")
        if self.min_impressions < 1:
            raise ValueError("min_impressions must be positive")
        if self.thresholds is not None and not 0 <= self.thresholds[0] <= self.thresholds[1] <= self.thresholds[2]:
            raise ValueError("thresholds must be three ascending numbers, not negative")

    def bounds(self) -> tuple[Fraction, Fraction, Fraction]:
        """The thresholds as exact fractions (of the floats given)."""
        first, second, third = self.thresholds or DEFAULT_THRESHOLDS[self.model]
        return Fraction(first), Fraction(second), Fraction(third)

    def to_grade(self, score: Fraction, bounds: tuple[Fraction, Fraction, Fraction] | None = None) -> float:
        """The grade of a score (`bounds`: this grading's, when the caller has them already)."""
        if self.grade == "score":
            return min(round(float(score), SCORE_DECIMALS), MAX_ABS_GRADE)
        first, second, third = bounds or self.bounds()
        return 0.0 if score < first else 1.0 if score < second else 2.0 if score < third else 3.0


def coec(counts: PairCounts, rates: Sequence[Fraction]) -> tuple[Fraction, Evidence]:
    """The COEC score of a pair's counts under the CTR of each rank (`RankCounts.rates`), and its evidence."""
    expected = sum((n * rates[rank - 1] for rank, n in counts.by_rank.items()), Fraction(0))
    score = Fraction(counts.clicks) / expected if counts.clicks and expected else Fraction(0)
    return score, (("impressions", counts.impressions), ("clicks", counts.clicks),
                   ("expected_clicks", float(expected)))


def sdbn(counts: PairCounts) -> tuple[Fraction, Evidence]:
    """The SDBN score of a pair's counts, with PyClick's prior, and its evidence."""
    attractiveness = Fraction(counts.clicks + PRIOR_NUMERATOR, counts.examinations + PRIOR_DENOMINATOR)
    satisfaction = Fraction(counts.last_clicks + PRIOR_NUMERATOR, counts.clicks + PRIOR_DENOMINATOR)
    return attractiveness * satisfaction, (("impressions", counts.impressions), ("examinations", counts.examinations),
                                           ("clicks", counts.clicks), ("last_clicks", counts.last_clicks))


def model_of_evidence(evidence: Mapping[str, int | float]) -> Model:
    """The model whose evidence this is: only COEC's has expected clicks."""
    return "coec" if "expected_clicks" in evidence else "sdbn"


def score_of_evidence(evidence: Mapping[str, int | float]) -> float:
    """A judgment's score from its evidence, as anyone can check it: COEC clicks / expected clicks
    (0 without a click), SDBN attractiveness x satisfaction with the prior. Expected clicks are the
    nearest float of an exact fraction, so a COEC score within a rounding of a threshold may read
    on the other side of it than the grade."""
    clicks = int(evidence["clicks"])
    if model_of_evidence(evidence) == "coec":
        expected = float(evidence["expected_clicks"])
        return clicks / expected if clicks and expected else 0.0
    examinations, last_clicks = int(evidence["examinations"]), int(evidence["last_clicks"])
    return float(Fraction(clicks + PRIOR_NUMERATOR, examinations + PRIOR_DENOMINATOR)
                 * Fraction(last_clicks + PRIOR_NUMERATOR, clicks + PRIOR_DENOMINATOR))


class ClickCounts:
    """The counts of one partition's impressions with final clicks, by time bucket."""

    def __init__(self, max_rank: int) -> None:
        if max_rank < 1:
            raise ValueError("max_rank must be positive")
        self.max_rank = max_rank
        self.ranks: dict[int, RankCounts] = {}
        # pair -> bucket -> counts.
        self.pairs: dict[Pair, dict[int, PairCounts]] = {}
        # What changed since `take_touched` (`click_state`): the buckets of rank counts, the
        # (bucket, pair) counts, and the buckets forgotten.
        self.touched_ranks: set[int] = set()
        self.touched_pairs: set[tuple[int, Pair]] = set()
        self.forgotten: set[int] = set()

    def add(self, impression: FinalImpression, bucket: int) -> None:
        """Count one impression whose clicks are final in `bucket` (its own time's)."""
        ranks = self.ranks.get(bucket)
        if ranks is None:
            ranks = self.ranks[bucket] = RankCounts.empty(self.max_rank)
        self.touched_ranks.add(bucket)
        clicked = impression.clicked
        last = max(clicked) if clicked else self.max_rank
        for rank, doc in impression.ranks:
            if rank > self.max_rank:
                continue
            ranks.shown[rank - 1] += 1
            by_bucket = self.pairs.setdefault((impression.query_id, doc), {})
            counts = by_bucket.get(bucket)
            if counts is None:
                counts = by_bucket[bucket] = PairCounts()
            self.touched_pairs.add((bucket, (impression.query_id, doc)))
            counts.impressions += 1
            counts.by_rank[rank] = counts.by_rank.get(rank, 0) + 1
            if rank <= last:
                counts.examinations += 1
            if rank in clicked:
                ranks.clicked[rank - 1] += 1
                counts.clicks += 1
                if rank == last:
                    counts.last_clicks += 1

    def forget_before(self, bucket: int) -> bool:
        """Drop the buckets before `bucket`; whether there were any."""
        old = [b for b in self.ranks if b < bucket]
        for b in old:
            del self.ranks[b]
        self.touched_ranks.update(old)
        self.forgotten.update(old)
        if old:
            for pair in list(self.pairs):
                by_bucket = self.pairs[pair]
                for b in [b for b in by_bucket if b < bucket]:
                    del by_bucket[b]
                if not by_bucket:
                    del self.pairs[pair]
        return bool(old)

    def rank_counts(self, since: int | None = None) -> RankCounts:
        """The rank counts of the buckets from `since` on (None: all), summed."""
        total = RankCounts.empty(self.max_rank)
        for bucket, counts in self.ranks.items():
            if since is None or bucket >= since:
                total.add(counts)
        return total

    def pair_counts(self, pair: Pair, since: int | None = None) -> PairCounts:
        """A pair's counts of the buckets from `since` on, summed."""
        total = PairCounts()
        for bucket, counts in self.pairs.get(pair, {}).items():
            if since is None or bucket >= since:
                total.add(counts)
        return total

    def changes(self, grading: Grading, ctr: RankCounts, since: int | None,
                previous: Mapping[Pair, float]) -> list[tuple[Pair, float | None, Evidence]]:
        """The pairs whose grade is not `previous`' (a pair absent there has none), with the grade
        (None below the minimum of impressions) and evidence, in pair order: over the pairs with
        counts from `since` on and those of `previous`. `ctr` is the rank counts of every partition
        over the same buckets (COEC's CTR is global). A score is computed only where a grade is."""
        rates = ctr.rates() if grading.model == "coec" else []
        bounds = grading.bounds()
        changed: list[tuple[Pair, float | None, Evidence]] = []
        for pair in sorted(self.pairs.keys() | previous.keys()):
            counts = self.pair_counts(pair, since)
            if counts.impressions < grading.min_impressions and pair not in previous:
                continue
            score, evidence = coec(counts, rates) if grading.model == "coec" else sdbn(counts)
            grade = grading.to_grade(score, bounds) if counts.impressions >= grading.min_impressions else None
            if grade != previous.get(pair):
                changed.append((pair, grade, evidence))
        return changed


    # -- plain data (`click_state`) -------------------------------------------

    def rank_state(self, bucket: int) -> list[list[int]] | None:
        """A bucket's rank counts as plain data, [shown, clicked]; None if it has none."""
        counts = self.ranks.get(bucket)
        return None if counts is None else [list(counts.shown), list(counts.clicked)]

    def pair_state(self, bucket: int, pair: Pair) -> list[Any] | None:
        """A pair's counts in a bucket as plain data: [impressions, clicks, examinations, last clicks,
        [[rank, impressions], ...]]; None if it has none."""
        counts = self.pairs.get(pair, {}).get(bucket)
        if counts is None:
            return None
        return [counts.impressions, counts.clicks, counts.examinations, counts.last_clicks,
                sorted([rank, n] for rank, n in counts.by_rank.items())]

    def states(self) -> tuple[dict[int, list[list[int]] | None], dict[tuple[int, Pair], list[Any] | None]]:
        """Every bucket's rank counts and every (bucket, pair)'s counts, as plain data."""
        return ({b: self.rank_state(b) for b in self.ranks},
                {(b, pair): self.pair_state(b, pair) for pair, by_bucket in self.pairs.items() for b in by_bucket})

    def restore(self, ranks: Mapping[int, list[list[int]] | None], pairs: Mapping[tuple[int, Pair], list[Any] | None],
                ) -> None:
        """Take the counts `states` gave into these empty counts."""
        for bucket, plain in ranks.items():
            if plain is not None:
                self.ranks[bucket] = RankCounts(list(plain[0]), list(plain[1]))
        for (bucket, pair), counts in pairs.items():
            if counts is not None:
                impressions, clicks, examinations, last_clicks, by_rank = counts
                self.pairs.setdefault(pair, {})[bucket] = PairCounts(impressions, clicks, {r: n for r, n in by_rank},
                                                                     examinations, last_clicks)

    def take_touched(self) -> tuple[set[int], set[tuple[int, Pair]], set[int]]:
        """The buckets of rank counts, the (bucket, pair) counts and the buckets forgotten since the
        last call."""
        touched = self.touched_ranks, self.touched_pairs, self.forgotten
        self.touched_ranks, self.touched_pairs, self.forgotten = set(), set(), set()
        return touched


def summed(parts: Iterable[RankCounts], max_rank: int) -> RankCounts:
    """The rank counts of several partitions added up: what COEC's CTR is computed from."""
    total = RankCounts.empty(max_rank)
    for part in parts:
        total.add(part)
    return total
