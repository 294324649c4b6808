"""Under the list ideal: a group's sums kept as its lists come and grades move.

Pure, standard library only. Under the list ideal each list has an ideal of its own, so a
group's sums are `metric.list_sums` of its lists scored one by one; scoring every list of a group
again whenever it takes an impression would cost in proportion to its distinct lists. So a
`ListTerms` keeps each list's score and the sums of their terms: a list shown again moves its
terms from its old count to its new (`added`, then `sync`), a grade that moved rescores the
lists that show its document (found through a `ListIndex`), and only a group read afresh
from the store scores all its lists once.

Exact by construction: each sum is kept as a whole number of 2**-1074 (`window_sums.exact`) of
the very terms `list_sums` adds (a list's DCG times its count, and so on), so what is taken out
is what was put in, and the sum, rounded once when asked for, is `list_sums`'s fsum bit for bit.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Set

from stream_ndcg.list_squares import INDEX_FROM
from stream_ndcg.metric import Measure, score_list
from stream_ndcg.vocabulary import dcg_at, dcg_squares_at, judged_at, ndcg_at, ndcg_squares_at, scored_at
from stream_ndcg.window_sums import exact, rounded

# One list's score per cut-off: its DCG, nDCG (None: undefined) and judged ratio.
Score = tuple[tuple[float, float | None, float], ...]
# Per cut-off, in this order, of a list's terms.
_FIELDS = (dcg_at, dcg_squares_at, ndcg_at, scored_at, ndcg_squares_at, judged_at)
# Where the scored impressions sit among a cut-off's terms: a count, not a sum of doubles.
_SCORED = _FIELDS.index(scored_at)


def _terms(score: Score, count: int) -> list[int]:
    """What a list of `score` shown `count` times adds to each sum, as `list_sums` forms each term."""
    terms: list[int] = []
    for dcg, ndcg, judged in score:
        if ndcg is None:
            terms += (exact(dcg * count), exact(dcg * dcg * count), 0, 0, 0, exact(judged * count))
        else:
            terms += (exact(dcg * count), exact(dcg * dcg * count), exact(ndcg * count), count,
                      exact(ndcg * ndcg * count), exact(judged * count))
    return terms


# A ranked list, as a group holds it.
Ranked = tuple[str, ...]


class ListIndex:
    """The lists of one group that show each document, once it holds `INDEX_FROM` lists.

    Each document's lists are a list, not a set: a list of a few lists takes far fewer bytes than
    a set, and there is one per document a group shows. A list may stand twice in one (a list that
    repeats a document); `showing` gives each once."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: dict[str | None, list[Ranked]] | None = None

    def added(self, ranked: Ranked, docs: Iterable[str | None]) -> None:
        """A list taken in, with the documents it shows."""
        index = self.index
        if index is not None:
            for doc in docs:
                held = index.get(doc)
                if held is None:
                    index[doc] = [ranked]
                else:
                    held.append(ranked)

    def showing(self, docs: Set[str], listed: Iterable[tuple[Ranked, Collection[str | None]]],
                size: int) -> Collection[Ranked]:
        """Those of the lists taken in that show any of `docs`: `listed` gives every one (itself and
        the documents it shows, walked only until the index is made), `size` how many there are."""
        if not docs:
            return ()
        if self.index is None:
            if size < INDEX_FROM:
                return [ranked for ranked, shown in listed if not docs.isdisjoint(shown)]
            self.index = {}
            for ranked, shown in listed:
                self.added(ranked, shown)
        index = self.index
        return {ranked for doc in docs if doc in index for ranked in index[doc]}


class ListTerms:
    """One group's lists' scores and the exact sums of their terms, per cut-off."""

    __slots__ = ("key", "cutoffs", "scores", "showing", "totals", "pending", "lists_of")

    def __init__(self, lists: dict[tuple[str, ...], int], grades: Mapping[str, float], measure: Measure) -> None:
        self.key = measure
        self.cutoffs = measure.cutoffs
        # list -> its score with the grades of the last `sync`
        self.scores: dict[tuple[str, ...], Score] = {}
        # Where the lists of `scores` show each document.
        self.showing = ListIndex()
        self.totals = [0] * (len(_FIELDS) * len(measure.cutoffs))
        # Impressions of lists taken since the last `sync`, not in `totals` yet.
        self.pending: dict[tuple[str, ...], int] = {}
        # The lists it was made of: a store that gives the group others makes it stale.
        self.lists_of = lists
        for ranked, count in lists.items():
            self._move(self._score(ranked, grades, measure), count, 1)

    def added(self, ranked: tuple[str, ...], count: int) -> None:
        """The group took `count` impressions of a list."""
        self.pending[ranked] = self.pending.get(ranked, 0) + count

    def sync(self, lists: Mapping[tuple[str, ...], int], grades: Mapping[str, float], measure: Measure,
             moved: Set[str]) -> dict[str, float]:
        """The sums of `lists` (every list of the group, with its count) with the query's `grades`;
        `moved`: the documents whose grade moved since the last call."""
        pending = self.pending
        for ranked in self.showing.showing(moved, zip(self.scores, self.scores, strict=True),
                                           len(self.scores)):
            counted = lists[ranked] - pending.get(ranked, 0)
            self._move(self.scores[ranked], counted, -1)
            self._move(self._score(ranked, grades, measure), counted, 1)
        for ranked, count in pending.items():
            score = self.scores.get(ranked)
            if score is None:
                score = self._score(ranked, grades, measure)
            self._move(score, lists[ranked] - count, -1)
            self._move(score, lists[ranked], 1)
        self.pending = {}
        sums: dict[str, float] = {}
        width = len(_FIELDS)
        for i, k in enumerate(self.cutoffs):
            for j, name in enumerate(_FIELDS):
                total = self.totals[i * width + j]
                sums[name(k)] = float(total) if j == _SCORED else rounded(total)
        return sums

    def _move(self, score: Score, count: int, sign: int) -> None:
        if count:
            totals = self.totals
            for i, term in enumerate(_terms(score, count)):
                totals[i] += sign * term

    def _score(self, ranked: tuple[str, ...], grades: Mapping[str, float], measure: Measure) -> Score:
        """A list scored with the query's grades (`metric.score_list`, the definition), and indexed
        when it is new."""
        if ranked not in self.scores:
            self.showing.added(ranked, ranked)
        scored = score_list(ranked, grades, measure)
        score = self.scores[ranked] = tuple((scored.dcg[k], scored.ndcg[k], scored.judged_ratio[k])
                                            for k in measure.cutoffs)
        return score
