"""The sums of squares of a group's lists' DCG@k under the pool ideal, kept as lists come and grades move.

Pure, standard library only. A square needs each list's own DCG, which where judged documents
stand (all `metric.pooled_sums` reads) does not tell, and scoring every list of a group again
whenever it takes an impression would cost in proportion to its distinct lists. So a
`ListSquares` keeps each list's DCGs and the sums: a list shown again adds its square (`added`,
then `sums`), a grade that moved rescores the lists that show its document (found through an
index of them once the group holds a few, `ListIndex`), and only a group read afresh from the store
scores all its lists once. Each sum of the squares (each rounded, as
the replay's are) is kept exact, as a whole number of 2**-1074, so that what is taken out is
what was put in and the sum is the same number however the lists came: rounded once, when
asked for.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Collection, Mapping, Sequence, Set
from itertools import repeat
from typing import cast

from stream_ndcg.metric import discount
from stream_ndcg.vocabulary import dcg_squares_at
from stream_ndcg.window_sums import exact, rounded

# A gain looked up by document, None being no document: it finds no gain.
_GainOf = Callable[[str | None, float], float]


@functools.cache
def _discounts(depth: int) -> tuple[float, ...]:
    return tuple(discount(rank) for rank in range(1, depth + 1))


def list_dcgs(ranked: Sequence[str], gains: Mapping[str, float], cutoffs: Sequence[int]) -> tuple[float, ...]:
    """One list's DCG at each cut-off, as `metric.ListScorer` scores it (the interpreter's own
    loops: a judgment rescores every list that shows its document)."""
    top: Sequence[str | None] = ranked[:max(cutoffs)]
    if len(set(top)) != len(top):
        # A repeat counts only at its first rank.
        top = [None if doc in top[:rank] else doc for rank, doc in enumerate(top)]
    gain_of = cast(_GainOf, gains.get)
    terms = list(map(operator.mul, map(gain_of, top, repeat(0.0)), _discounts(len(top))))
    return tuple(math.fsum(terms[:k]) or 0.0 for k in cutoffs)


# Below this many distinct lists in a group, walking them to find those that show a document costs
# less than keeping an index of them (a set per document, each an object the collector walks): a
# bound that does not grow, so a judgment still costs in proportion to the places it changes.
INDEX_FROM = 16


class ListIndex:
    """The lists of one group that show each document, once it holds `INDEX_FROM` lists."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: dict[str, set[tuple[str, ...]]] | None = None

    def added(self, ranked: tuple[str, ...]) -> None:
        """A list taken in."""
        if self.index is not None:
            for doc in ranked:
                self.index.setdefault(doc, set()).add(ranked)

    def showing(self, docs: Set[str], lists: Collection[tuple[str, ...]]) -> Collection[tuple[str, ...]]:
        """Those of `lists` (every list taken in) that show any of `docs`."""
        if not docs:
            return ()
        if self.index is None:
            if len(lists) < INDEX_FROM:
                return [ranked for ranked in lists if not docs.isdisjoint(ranked)]
            self.index = {}
            for ranked in lists:
                self.added(ranked)
        index = self.index
        return {ranked for doc in docs if doc in index for ranked in index[doc]}


def _squares(dcgs: tuple[float, ...], count: int) -> list[int]:
    """Each DCG's square, rounded as the replay's `value * value` is, times `count`, exact."""
    # Most lists of a query with few judgments score 0 at every cut-off.
    return [count * exact(value * value) for value in dcgs] if any(dcgs) else [0] * len(dcgs)


class ListSquares:
    """One group's lists' DCGs and the exact sums of their squares, per cut-off."""

    __slots__ = ("dcgs", "showing", "totals", "pending", "cutoffs")

    def __init__(self) -> None:
        # list -> its DCG at each cut-off, with the gains of the last `sums`
        self.dcgs: dict[tuple[str, ...], tuple[float, ...]] = {}
        # Where the lists of `dcgs` show each document: a moved grade rescores those, not every list.
        self.showing = ListIndex()
        # Per cut-off, the sum over the lists counted so far; None: nothing counted yet.
        self.totals: list[int] | None = None
        # Impressions of lists taken since the last `sums`, not in `totals` yet.
        self.pending: dict[tuple[str, ...], int] = {}
        self.cutoffs: tuple[int, ...] = ()

    def added(self, ranked: tuple[str, ...], count: int) -> None:
        """The group took `count` impressions of a list."""
        if self.totals is not None:
            self.pending[ranked] = self.pending.get(ranked, 0) + count

    def sums(self, lists: Mapping[tuple[str, ...], int], gains: Mapping[str, float], cutoffs: tuple[int, ...],
             moved: Set[str]) -> dict[str, float]:
        """The sums of squares of DCG@k of `lists` (every list of the group, with its count) with
        the query's `gains`; `moved`: the documents whose grade moved since the last call."""
        if self.totals is None or self.cutoffs != cutoffs:
            self.dcgs, self.showing, self.cutoffs, self.pending = {}, ListIndex(), cutoffs, {}
            totals = [0] * len(cutoffs)
            for ranked, count in lists.items():
                dcgs = self._score(ranked, gains)
                totals = [a + b for a, b in zip(totals, _squares(dcgs, count), strict=True)]
            self.totals = totals
        else:
            totals = self.totals
            pending = self.pending
            for ranked in self.showing.showing(moved, self.dcgs.keys()):
                counted = lists[ranked] - pending.get(ranked, 0)
                if counted:
                    old, new = self.dcgs[ranked], list_dcgs(ranked, gains, cutoffs)
                    if old != new:
                        self.dcgs[ranked] = new
                        totals = [t - a + b for t, a, b in zip(totals, _squares(old, counted), _squares(new, counted),
                                                                strict=True)]
            for ranked, count in pending.items():
                known = self.dcgs.get(ranked)
                if known is None:
                    known = self._score(ranked, gains)
                # Most lists of a query with few judgments score 0 at every cut-off: they add nothing.
                if any(known):
                    totals = [a + b for a, b in zip(totals, _squares(known, count), strict=True)]
            self.totals, self.pending = totals, {}
        return {dcg_squares_at(k): rounded(total) for k, total in zip(cutoffs, totals, strict=True)}

    def _score(self, ranked: tuple[str, ...], gains: Mapping[str, float]) -> tuple[float, ...]:
        """A list taken in: its DCGs, and where its documents are found."""
        dcgs = self.dcgs[ranked] = list_dcgs(ranked, gains, self.cutoffs)
        self.showing.added(ranked)
        return dcgs
