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

What a list costs is most of what the squares cost (in the service's workload nearly every
impression is a list of its own), so the common cases are cut short: a list that shows no judged
document is scored by its lookups alone, a grade that moves between none and a zero gain rescores
nothing, and the exact square of a DCG is found once for all the lists that score it (`_SQUARES`:
in a query with few judgments most lists score one of a few sums). The compiled core (mypyc)
runs this module as C, where typed loops over lists of floats and ints pay and calls through
`map` or `operator` do not: it is written for that, the Python sources staying the reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence, Set
from typing import Final, Generic, NamedTuple, TypeVar

from stream_ndcg.metric import discount
from stream_ndcg.vocabulary import dcg_squares_at
from stream_ndcg.window_sums import exact, rounded


class _Layout(NamedTuple):
    """What scoring a list at some cut-offs needs, found once per cut-offs."""

    cutoffs: tuple[int, ...]
    # The discount of each rank from 1 to the deepest cut-off.
    discounts: tuple[float, ...]
    # The name of each sum of squares.
    names: tuple[str, ...]


@functools.cache
def _layout(cutoffs: tuple[int, ...]) -> _Layout:
    return _Layout(cutoffs, tuple(discount(rank) for rank in range(1, max(cutoffs) + 1)),
                   tuple(dcg_squares_at(k) for k in cutoffs))


def list_dcgs(tops: Sequence[tuple[str | None, ...]], gains: dict[str, float], layout: _Layout) -> list[float]:
    """Lists' DCGs at each cut-off, as `metric.ListScorer` scores them, one list after another: the
    DCGs of the i-th list of `tops` are the i-th `len(layout.cutoffs)` values. Each list is given by
    the ranks its DCGs read (`_top`: a repeated document None at its later ranks).

    Each DCG is the `fsum` of its list's terms (gain times discount), of which only the nonzero
    count: with none it is 0, with one that term, and with two their sum, which IEEE arithmetic
    rounds as fsum rounds the exact sum. The sign of a zero is left as it comes: a DCG here is only
    ever squared or compared."""
    cutoffs, discounts = layout.cutoffs, layout.discounts
    deepest = len(discounts)
    found: list[float] = []
    # The nonzero terms of the list being scored and their ranks (from 0), the first `judged` of each.
    terms = [0.0] * deepest
    ranks = [0] * deepest
    for top in tops:
        judged = 0
        for rank in range(min(len(top), deepest)):
            doc = top[rank]
            if doc is None:
                continue
            gain = gains.get(doc)
            if gain is None:
                continue
            term = gain * discounts[rank]
            if term != 0.0:
                terms[judged] = term
                ranks[judged] = rank
                judged += 1
        for k in cutoffs:
            within = 0
            while within < judged and ranks[within] < k:
                within += 1
            if within == 0:
                found.append(0.0)
            elif within == 1:
                found.append(terms[0])
            elif within == 2:
                found.append(terms[0] + terms[1])
            else:
                found.append(_fsum(terms[:within]))
    return found


def _top(ranked: tuple[str, ...], depth: int) -> tuple[str | None, ...]:
    """The ranks a list's DCGs read: the list cut to `depth`, a document repeated counted at its
    first rank only (None at the others). The list itself for most."""
    top = ranked if len(ranked) <= depth else ranked[:depth]
    if len(set(top)) == len(top):
        return top
    return tuple([None if doc in top[:rank] else doc for rank, doc in enumerate(top)])


# How many DCGs' squares `_SQUARES` holds at most: past it, it starts again (they are found again
# as the lists that show them are scored).
_SQUARES_HELD: Final = 1 << 16

# A DCG -> its square, rounded as the replay's `value * value` is, exact: in a query with few
# judgments most lists score one of a few DCGs. (Final: the compiled core keeps it, and `_fsum`,
# in a C variable rather than the module's dict.)
_SQUARES: Final[dict[float, int]] = {}
_fsum: Final = math.fsum


def _square(value: float) -> int:
    square = _SQUARES.get(value)
    if square is None:
        if len(_SQUARES) >= _SQUARES_HELD:
            _SQUARES.clear()
        square = _SQUARES[value] = exact(value * value)
    return square


# Below this many distinct lists in a group, walking them to find those that show a document costs
# less than keeping an index of them (a list per document, each an object the collector walks): a
# bound that does not grow, so a judgment still costs in proportion to the places it changes.
INDEX_FROM = 16

# What the owner of an index calls each list: the list itself, or a number.
Key = TypeVar("Key", bound=Hashable)


class ListIndex(Generic[Key]):
    """The lists of one group that show each document, by the key its owner gives each list, once
    it holds `INDEX_FROM` lists.

    Each document's lists are a list, not a set: a list of a few keys takes far fewer bytes than a
    set, and there is one per document a group shows. A key may stand twice in one (a list that
    repeats a document); `showing` gives each once."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: dict[str | None, list[Key]] | None = None

    def added(self, key: Key, docs: Iterable[str | None]) -> None:
        """A list taken in, with the documents it shows."""
        index = self.index
        if index is not None:
            for doc in docs:
                keys = index.get(doc)
                if keys is None:
                    index[doc] = [key]
                else:
                    keys.append(key)

    def showing(self, docs: Set[str], listed: Iterable[tuple[Key, Collection[str | None]]],
                size: int) -> Collection[Key]:
        """Those of the lists taken in that show any of `docs`: `listed` gives every one (its key and
        documents, walked only until the index is made), `size` how many there are."""
        if not docs:
            return ()
        if self.index is None:
            if size < INDEX_FROM:
                return [key for key, shown in listed if not docs.isdisjoint(shown)]
            self.index = {}
            for key, shown in listed:
                self.added(key, shown)
        index = self.index
        return {key for doc in docs if doc in index for key in index[doc]}


class ListSquares:
    """One group's lists' DCGs and the exact sums of their squares, per cut-off.

    Each list is known by a number, given in the order the lists came, and what is kept of it is
    found by that number: a list's tuple is hashed once per impression, never again for a
    rescoring, and the index holds numbers. The lists' DCGs stand in one list of floats, a list's at
    its number times the cut-offs, rather than in a tuple per list."""

    __slots__ = ("numbers", "tops", "dcgs", "counts", "showing", "totals", "pending", "pending_counts", "layout",
                 "found")

    def __init__(self) -> None:
        # list -> its number
        self.numbers: dict[tuple[str, ...], int] = {}
        # By number: the ranks its DCGs read (the list itself but for a few: `_top`), and the
        # impressions of it counted in `totals`.
        self.tops: list[tuple[str | None, ...]] = []
        self.counts: list[int] = []
        # Each list's DCG at each cut-off with the gains of the last `sums` (by number, then cut-off).
        self.dcgs: list[float] = []
        # Where the lists show each document: a moved grade rescores those, not every list.
        self.showing: ListIndex[int] = ListIndex()
        # Per cut-off, the sum over the lists counted so far; None: nothing counted yet.
        self.totals: list[int] | None = None
        # Lists taken since the last `sums`, and the impressions of each, not in `totals` yet.
        # (A list taken more than once stands once per time: no list is hashed to be taken.)
        self.pending: list[tuple[str, ...]] = []
        self.pending_counts: list[int] = []
        self.layout = _layout((1,))
        # What the last `sums` gave, while `totals` stay as they were.
        self.found: dict[str, float] = {}

    def added(self, ranked: tuple[str, ...], count: int) -> None:
        """The group took `count` impressions of a list."""
        if self.totals is not None:
            self.pending.append(ranked)
            self.pending_counts.append(count)

    def sums(self, lists: Mapping[tuple[str, ...], int], gains: Mapping[str, float], cutoffs: tuple[int, ...],
             moved: Set[str], before: Mapping[str, float | None] | None = None) -> dict[str, float]:
        """The sums of squares of DCG@k of `lists` (every list of the group, with its count) with
        the query's `gains`; `moved`: the documents whose grade moved since the last call, and with
        `before` the gains they had then (those that went between none and a zero gain move no DCG).
        The dict given is kept for the next call (read it, do not change it)."""
        table = gains if isinstance(gains, dict) else dict(gains)
        totals = self.totals
        if totals is None or self.layout.cutoffs != cutoffs:
            self.numbers, self.tops, self.dcgs, self.counts = {}, [], [], []
            self.showing, self.layout = ListIndex(), _layout(cutoffs)
            totals = self.totals = [0] * len(cutoffs)
            self.pending, self.pending_counts = list(lists.keys()), list(lists.values())
            changed = True
        else:
            changed = False
            if moved and before is not None:
                moved = {doc for doc in moved if doc not in before or (before[doc] or 0.0) != (table.get(doc) or 0.0)}
        tops, dcgs, counts, layout = self.tops, self.dcgs, self.counts, self.layout
        stride = len(cutoffs)
        rescored = list(self.showing.showing(moved, enumerate(tops), len(tops))) if moved else []
        if rescored:
            scores = list_dcgs([tops[number] for number in rescored], table, layout)
            for i, number in enumerate(rescored):
                count = counts[number]
                for cut in range(stride):
                    old, new = dcgs[number * stride + cut], scores[i * stride + cut]
                    if old != new:
                        dcgs[number * stride + cut] = new
                        moved_by = _square(new) - _square(old)
                        totals[cut] += moved_by if count == 1 else count * moved_by
                        changed = True
        # The lists new to the group are numbered and indexed as they come, their impressions
        # counted, and scored together once all are in (a new list shown twice holds both).
        numbers, index, depth = self.numbers, self.showing, len(layout.discounts)
        first_new = len(tops)
        pending, pending_counts = self.pending, self.pending_counts
        for i, ranked in enumerate(pending):
            count = pending_counts[i]
            held = numbers.get(ranked, -1)
            if held < 0:
                numbers[ranked] = len(tops)
                top = _top(ranked, depth)
                index.added(len(tops), top)
                tops.append(top)
                counts.append(count)
                continue
            counts[held] += count
            if held < first_new:
                for cut in range(stride):
                    value = dcgs[held * stride + cut]
                    if value != 0.0:
                        totals[cut] += count * _square(value)
                        changed = True
        pending.clear()
        pending_counts.clear()
        if len(tops) > first_new:
            scores = list_dcgs(tops[first_new:], table, layout)
            dcgs.extend(scores)
            for number in range(first_new, len(tops)):
                count, last, square = counts[number], 0.0, 0
                for cut in range(stride):
                    value = scores[(number - first_new) * stride + cut]
                    if value != 0.0:
                        if value != last:
                            # A list's DCGs at two cut-offs are often the same (nothing judged between).
                            last, square = value, _square(value)
                        totals[cut] += square if count == 1 else count * square
                        changed = True
        if changed:
            names = layout.names
            self.found = {names[cut]: rounded(totals[cut]) for cut in range(stride)}
        return self.found
