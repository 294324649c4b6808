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
document scores 0 without being scored, a grade that moves between none and a zero gain rescores
nothing, and the exact squares of a list's DCGs are found once for all the lists that share them
(`_SQUARES`: in a query with few judgments most lists score one of a few sums).
"""

from __future__ import annotations

import functools
import math
import operator
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence, Set
from itertools import repeat
from typing import Generic, NamedTuple, TypeVar, cast

from stream_ndcg.metric import discount
from stream_ndcg.vocabulary import dcg_squares_at
from stream_ndcg.window_sums import exact, rounded

# A gain looked up by document, None being no document: it finds no gain.
_GainOf = Callable[[str | None, float], float]


class _Layout(NamedTuple):
    """What scoring a list at some cut-offs needs, found once per cut-offs."""

    cutoffs: tuple[int, ...]
    # The discount of each rank from 1 to the deepest cut-off, and a zero gain for each.
    discounts: tuple[float, ...]
    zeros: tuple[float, ...]
    # The DCGs of a list that shows no judged document.
    unjudged: tuple[float, ...]
    # The name of each sum of squares.
    names: tuple[str, ...]


@functools.cache
def _layout(cutoffs: tuple[int, ...]) -> _Layout:
    depth = max(cutoffs)
    return _Layout(cutoffs, tuple(discount(rank) for rank in range(1, depth + 1)), (0.0,) * depth,
                   (0.0,) * len(cutoffs), tuple(dcg_squares_at(k) for k in cutoffs))


def list_dcgs(tops: Iterable[Sequence[str | None]], gains: Mapping[str, float],
              layout: _Layout) -> list[tuple[float, ...]]:
    """Lists' DCGs at each cut-off, as `metric.ListScorer` scores them, each list given by the ranks
    its DCGs read (to the deepest cut-off, a repeat's later ranks None: `_top`). The interpreter's
    own loops, with the usual one or two cut-offs written out: a judgment rescores every list that
    shows its document, so many lists are scored in one call. The sign of a zero is left as it
    comes: a DCG here is only ever squared or compared."""
    gain_of = cast(_GainOf, gains.get)
    zeros, discounts, cutoffs = layout.zeros, layout.discounts, layout.cutoffs
    fsum, mul = math.fsum, operator.mul
    depth = len(discounts)
    if len(cutoffs) == 1:
        return [(fsum(map(mul, map(gain_of, top, zeros), discounts)),) for top in tops]
    found: list[tuple[float, ...]] = []
    if len(cutoffs) == 2 and cutoffs[1] == depth:
        first = cutoffs[0]
        for top in tops:
            terms = list(map(mul, map(gain_of, top, zeros), discounts))
            found.append((fsum(terms[:first]), fsum(terms)))
        return found
    for top in tops:
        terms = list(map(mul, map(gain_of, top, zeros), discounts))
        found.append(tuple([fsum(terms[:k]) for k in cutoffs]))
    return found


def _top(ranked: tuple[str, ...], depth: int) -> tuple[str | None, ...] | None:
    """The ranks a list's DCGs read, if they are not the list itself: cut to `depth`, and a
    document repeated counted at its first rank only (None at the others)."""
    top = ranked[:depth]
    if len(set(top)) == len(top):
        return None if len(top) == len(ranked) else top
    return tuple(None if doc in top[:rank] else doc for rank, doc in enumerate(top))


# How many DCGs' squares `_SQUARES` holds at most: past it, it starts again (they are found again
# as the lists that share them are scored).
_SQUARES_HELD = 1 << 16


class _Squares(dict[tuple[float, ...], tuple[int, ...]]):
    """A list's DCGs -> their squares, each rounded as the replay's `value * value` is, exact."""

    def __missing__(self, dcgs: tuple[float, ...]) -> tuple[int, ...]:
        if len(self) >= _SQUARES_HELD:
            self.clear()
        squares = self[dcgs] = tuple([exact(value * value) for value in dcgs])
        return squares


_SQUARES = _Squares()


# Below this many distinct lists in a group, walking them to find those that show a document costs
# less than keeping an index of them (a set per document, each an object the collector walks): a
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
        self.index: defaultdict[str | None, list[Key]] | None = None

    def added(self, key: Key, docs: Iterable[str | None]) -> None:
        """A list taken in, with the documents it shows."""
        if self.index is not None:
            # Each document's lists, the list added to each, in the interpreter's own loops.
            any(map(list.append, map(self.index.__getitem__, docs), repeat(key)))

    def showing(self, docs: Set[str], listed: Iterable[tuple[Key, Collection[str | None]]],
                size: int) -> Collection[Key]:
        """Those of the lists taken in that show any of `docs`: `listed` gives every one (its key and
        documents, walked only until the index is made), `size` how many there are."""
        if not docs:
            return ()
        if self.index is None:
            if size < INDEX_FROM:
                return [key for key, shown in listed if not docs.isdisjoint(shown)]
            self.index = defaultdict(list)
            for key, shown in listed:
                self.added(key, shown)
        index = self.index
        return {key for doc in docs if doc in index for key in index[doc]}


class ListSquares:
    """One group's lists' DCGs and the exact sums of their squares, per cut-off.

    Each list is known by a number, given in the order the lists came, and what is kept of it is
    found by that number: a list's tuple is hashed once per impression, never again for a
    rescoring, and the index holds numbers."""

    __slots__ = ("numbers", "tops", "dcgs", "counts", "showing", "totals", "pending", "layout", "found")

    def __init__(self) -> None:
        # list -> its number
        self.numbers: dict[tuple[str, ...], int] = {}
        # By number: the ranks its DCGs read (the list itself but for a few: `_top`), its DCG at each
        # cut-off with the gains of the last `sums`, and the impressions of it counted in `totals`.
        self.tops: list[Sequence[str | None]] = []
        self.dcgs: list[tuple[float, ...]] = []
        self.counts: list[int] = []
        # Where the lists show each document: a moved grade rescores those, not every list.
        self.showing: ListIndex[int] = ListIndex()
        # Per cut-off, the sum over the lists counted so far; None: nothing counted yet.
        self.totals: list[int] | None = None
        # Impressions of lists taken since the last `sums`, not in `totals` yet.
        # (A list taken more than once stands once per time: no list is hashed to be taken.)
        self.pending: list[tuple[tuple[str, ...], int]] = []
        self.layout = _layout((1,))
        # What the last `sums` gave, while `totals` stay as they were.
        self.found: dict[str, float] = {}

    def added(self, ranked: tuple[str, ...], count: int) -> None:
        """The group took `count` impressions of a list."""
        if self.totals is not None:
            self.pending.append((ranked, count))

    def sums(self, lists: Mapping[tuple[str, ...], int], gains: Mapping[str, float], cutoffs: tuple[int, ...],
             moved: Set[str], before: Mapping[str, float | None] | None = None) -> dict[str, float]:
        """The sums of squares of DCG@k of `lists` (every list of the group, with its count) with
        the query's `gains`; `moved`: the documents whose grade moved since the last call, and with
        `before` the gains they had then (those that went between none and a zero gain move no DCG).
        The dict given is kept for the next call (read it, do not change it)."""
        if self.totals is None or self.layout.cutoffs != cutoffs:
            self.numbers, self.tops, self.dcgs, self.counts = {}, [], [], []
            self.showing, self.layout = ListIndex(), _layout(cutoffs)
            self.totals, self.pending = [0] * len(cutoffs), list(lists.items())
            changed = True
        else:
            changed = False
            if moved and before is not None:
                moved = {doc for doc in moved if doc not in before or (before[doc] or 0.0) != (gains.get(doc) or 0.0)}
        tops, dcgs, counts, layout = self.tops, self.dcgs, self.counts, self.layout
        # DCGs -> the impressions that moved to them (less those that left them), for their squares
        # to be found once however many lists share them.
        moves: dict[tuple[float, ...], int] = {}
        rescored = list(self.showing.showing(moved, enumerate(tops), len(tops))) if moved else []
        if rescored:
            for number, new in zip(rescored, list_dcgs([tops[number] for number in rescored], gains, layout),
                                   strict=True):
                old = dcgs[number]
                if old != new:
                    dcgs[number] = new
                    counted = counts[number]
                    moves[old] = moves.get(old, 0) - counted
                    moves[new] = moves.get(new, 0) + counted
        numbers, unjudged = self.numbers, layout.unjudged
        # The new lists that show a judged document, scored together (each with all its impressions
        # counted: they all came since the last call, a new list shown twice held on its second);
        # a list held already has its DCGs as the rescoring above left them.
        scored: list[int] = []
        depth, judged, index = len(layout.discounts), gains.keys(), self.showing
        for ranked, count in self.pending:
            held = numbers.get(ranked)
            if held is None:
                # Taken in: numbered and indexed, its DCGs those of a list that shows no judged
                # document until it is scored.
                held = numbers[ranked] = len(tops)
                top = _top(ranked, depth) or ranked
                tops.append(top)
                counts.append(count)
                dcgs.append(unjudged)
                index.added(held, top)
                if not judged.isdisjoint(top):
                    scored.append(held)
            else:
                counts[held] += count
                known = dcgs[held]
                # A list that shows no judged document adds nothing (nor, yet, one to be scored).
                if known is not unjudged:
                    moves[known] = moves.get(known, 0) + count
        if scored:
            for number, new in zip(scored, list_dcgs([tops[number] for number in scored], gains, layout),
                                   strict=True):
                dcgs[number] = new
                moves[new] = moves.get(new, 0) + counts[number]
        self.pending = []
        totals = self.totals
        for known, count in moves.items():
            if count and any(known):
                changed = True
                for i, square in enumerate(_SQUARES[known]):
                    totals[i] += count * square
        if changed:
            self.found = {name: rounded(total) for name, total in zip(layout.names, totals, strict=True)}
        return self.found
