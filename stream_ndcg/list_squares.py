"""The sums of squares of a group's lists' DCG@k under the pool ideal, kept as lists come and grades move.

Pure, standard library only. A square needs each list's own DCG, which where judged documents
stand (all `metric.pooled_sums` reads) does not tell, and scoring every list of a group again
whenever it takes an impression would cost in proportion to its distinct lists. So a
`ListSquares` keeps each list's DCGs and the sums: a list shown again adds its square (`added`,
then `sums`), a grade that moved rescores the lists that show its document at the places it
moved and those judged documents stand at (found through an index of the lists once the group
holds a few), and only a group read afresh from the store scores all its lists once. Each sum of
the squares (each rounded, as the replay's are) is kept exact, as a whole number of 2**-1074, so
that what is taken out is what was put in and the sum is the same number however the lists
came: rounded once, when asked for.

What a list costs is most of what the squares cost (in the service's workload nearly every
impression is a list of its own), so the common cases are cut short: a list that shows no judged
document is scored by its lookups alone, a grade that moves between none and a zero gain rescores
nothing, the exact square of a DCG is found once for all the lists that score it (`_SQUARES`: in
a query with few judgments most lists score one of a few sums), and a DCG's fsum and what a
batch's rescorings move a sum by are found in pairs of doubles that hold them exactly
(`window_sums.fsum_of`, `window_sums.add_exactly`) rather than in calls and whole numbers of
some 1,100 bits. The compiled core runs the loops that score, rescore and take in lists in C
(`squares_kernel.c`: the terms and DCGs as doubles, each square added into a fixed-point
accumulator, a document's gain looked up once per call), where the deepest cut-off is at most 64;
the loops below are its reference, run by the pure core (and, compiled by mypyc, for deeper
cut-offs), and a unit test holds the two equal to the last bit.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Collection, Mapping, Sequence, Set
from typing import Final, NamedTuple

from stream_ndcg.core_build import core_build
from stream_ndcg.metric import discount
from stream_ndcg.vocabulary import dcg_squares_at
from stream_ndcg.window_sums import add_exactly, exact, fsum_of, rounded

# Whether the loops run in `squares_kernel` (C): on the compiled core, within its masks' 64 ranks.
_NATIVE: Final = core_build().core == "compiled"
if _NATIVE:
    import stream_ndcg.squares_kernel as squares_kernel


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


def list_dcgs(tops: Sequence[tuple[str | None, ...]], gains: dict[str, float], layout: _Layout,
              masks: list[int]) -> list[float]:
    """Lists' DCGs at each cut-off, as `metric.ListScorer` scores them, one list after another: the
    DCGs of the i-th list of `tops` are the i-th `len(layout.cutoffs)` values. Each list is given by
    the ranks its DCGs read (`_top`: a repeated document None at its later ranks). Each list's
    nonzero terms' ranks are appended to `masks` (bit r: rank r + 1), what `masked_dcgs` rescores
    it from."""
    discounts = layout.discounts
    deepest = len(discounts)
    found: list[float] = []
    # The nonzero terms of the list being scored and their ranks (from 0), the first `judged` of each.
    terms = [0.0] * deepest
    ranks = [0] * deepest
    for top in tops:
        judged = _nonzero_terms(top, (1 << min(len(top), deepest)) - 1, gains, discounts, terms, ranks)
        mask = 0
        for i in range(judged):
            mask |= 1 << ranks[i]
        masks.append(mask)
        _dcgs(terms, ranks, judged, layout.cutoffs, found)
    return found


def masked_dcgs(top: tuple[str | None, ...], mask: int, gains: dict[str, float], layout: _Layout,
                found: list[float], terms: list[float], ranks: list[int]) -> None:
    """One list's DCGs at each cut-off appended to `found`, read from the ranks its nonzero terms
    stand at (`mask`, as `list_dcgs` gives it) alone: the same numbers `list_dcgs` gives. `terms`
    and `ranks`: room for a term at each rank, written over."""
    judged = _nonzero_terms(top, mask, gains, layout.discounts, terms, ranks)
    _dcgs(terms, ranks, judged, layout.cutoffs, found)


def _nonzero_terms(top: tuple[str | None, ...], mask: int, gains: dict[str, float], discounts: tuple[float, ...],
                   terms: list[float], ranks: list[int]) -> int:
    """The nonzero terms (gain times discount) of `top` at the ranks `mask` sets (bit r: rank
    r + 1), written into `terms` and their ranks (from 0, rising) into `ranks`; how many."""
    judged = 0
    rank = 0
    while mask:
        doc = top[rank]
        if mask & 1 and doc is not None:
            gain = gains.get(doc)
            if gain is not None:
                term = gain * discounts[rank]
                if term != 0.0:
                    terms[judged] = term
                    ranks[judged] = rank
                    judged += 1
        mask >>= 1
        rank += 1
    return judged


def _dcgs(terms: list[float], ranks: list[int], judged: int, cutoffs: tuple[int, ...], found: list[float]) -> None:
    """A list's DCG at each cut-off appended to `found`, from its first `judged` nonzero `terms` and
    their `ranks` (from 0, rising).

    Each DCG is the `fsum` of its list's terms (gain times discount), of which only the nonzero
    count: with none it is 0, with one that term, and with two their sum, which IEEE arithmetic
    rounds as fsum rounds the exact sum; a cut-off that takes in no term more than the one before
    it has its DCG. The sign of a zero is left as it comes: a DCG here is only ever squared or
    compared."""
    last = -1
    value = 0.0
    for k in cutoffs:
        # The cut-offs come in any order: the terms within each are counted afresh.
        within = 0
        while within < judged and ranks[within] < k:
            within += 1
        if within != last:
            last = within
            if within == 0:
                value = 0.0
            elif within == 1:
                value = terms[0]
            elif within == 2:
                value = terms[0] + terms[1]
            else:
                value = fsum_of(terms, within)
        found.append(value)


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
# judgments most lists score one of a few DCGs. (Final: the compiled core keeps it in a C variable
# rather than the module's dict.)
_SQUARES: Final[dict[float, int]] = {}


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

class ListSquares:
    """One group's lists' DCGs and the exact sums of their squares, per cut-off.

    Each list is known by a number, given in the order the lists came, and what is kept of it is
    found by that number: a list's tuple is hashed once per impression, never again for a
    rescoring. The lists' DCGs stand in one array of doubles, a list's at its number times the
    cut-offs, rather than in a tuple per list. Each list's nonzero terms' ranks are kept too (a
    mask), so that a moved grade rescores a list from the places it moved and those judged
    documents stand at, not from every place. The lists that show each document are walked in a
    small group and indexed once a group holds `INDEX_FROM`: a list of numbers per document, a
    list's number one object however many documents it shows."""

    __slots__ = ("numbers", "tops", "dcgs", "counts", "masks", "showing", "totals", "pending", "pending_counts",
                 "pending_plain", "layout", "found")

    def __init__(self) -> None:
        # list -> its number
        self.numbers: dict[tuple[str, ...], int] = {}
        # By number: the ranks its DCGs read (the list itself but for a few: `_top`), the
        # impressions of it counted in `totals`, and the ranks of its nonzero terms (bit r: rank r + 1).
        self.tops: list[tuple[str | None, ...]] = []
        self.counts: list[int] = []
        self.masks: list[int] = []
        # Each list's DCG at each cut-off with the gains of the last `sums` (by number, then cut-off):
        # doubles side by side, 8 bytes each, where a list of floats holds an object of 32 for each.
        self.dcgs: array[float] = array("d")
        # document -> the numbers of the lists that show it; None: not indexed yet.
        self.showing: dict[str | None, list[int]] | None = None
        # Per cut-off, the sum over the lists counted so far; None: nothing counted yet.
        self.totals: list[int] | None = None
        # Lists taken since the last `sums`, the impressions of each, and whether it is known to
        # repeat no document within the depth, not in `totals` yet. (A list taken more than once
        # stands once per time: no list is hashed to be taken.)
        self.pending: list[tuple[str, ...]] = []
        self.pending_counts: list[int] = []
        self.pending_plain: list[bool] = []
        self.layout = _layout((1,))
        # What the last `sums` gave, while `totals` stay as they were.
        self.found: dict[str, float] = {}

    def added(self, ranked: tuple[str, ...], count: int, plain: bool = False) -> None:
        """The group took `count` impressions of a list; `plain`: it is known to repeat no document
        within the depth (`group_sums.index_list` tells), so that it needs no look for repeats."""
        if self.totals is not None:
            self.pending.append(ranked)
            self.pending_counts.append(count)
            self.pending_plain.append(plain)

    def sums(self, lists: Mapping[tuple[str, ...], int], gains: Mapping[str, float], cutoffs: tuple[int, ...],
             moved: Set[str], before: Mapping[str, float | None] | None = None) -> dict[str, float]:
        """The sums of squares of DCG@k of `lists` (every list of the group, with its count) with
        the query's `gains`; `moved`: the documents whose grade moved since the last call, and with
        `before` the gains they had then (those that went between none and a zero gain move no DCG).
        The dict given is kept for the next call (read it, do not change it)."""
        table = gains if isinstance(gains, dict) else dict(gains)
        if not table:
            # No document of the query is judged: every DCG is 0, and so is every square. Nothing is
            # kept of the lists: the query's first grade scores them all, as a group read afresh is.
            if self.totals is not None or self.layout.cutoffs != cutoffs or not self.found:
                if self.totals is not None:
                    self._let_go(cutoffs)
                else:  # nothing is kept before a first sum (most groups of a query without grades)
                    self.layout = _layout(cutoffs)
                self.found = {name: 0.0 for name in self.layout.names}
            return self.found
        totals = self.totals
        if totals is None or self.layout.cutoffs != cutoffs:
            self._let_go(cutoffs)
            totals = self.totals = [0] * len(cutoffs)
            self.pending, self.pending_counts = list(lists.keys()), list(lists.values())
            self.pending_plain = [False] * len(self.pending)
            changed = True
        else:
            changed = False
            if moved and before is not None:
                moved = {doc for doc in moved if doc not in before or (before[doc] or 0.0) != (table.get(doc) or 0.0)}
        if moved and self.tops and self._rescore(moved, table, totals):
            changed = True
        if self.pending and self._take_pending(table, totals):
            changed = True
        if changed:
            names, stride = self.layout.names, len(cutoffs)
            self.found = {names[cut]: rounded(totals[cut]) for cut in range(stride)}
        return self.found

    def _let_go(self, cutoffs: tuple[int, ...]) -> None:
        """Everything kept of the lists dropped, to be scored afresh at `cutoffs`."""
        self.numbers, self.tops, self.dcgs, self.counts, self.masks = {}, [], array("d"), [], []
        self.showing, self.layout, self.totals = None, _layout(cutoffs), None
        self.pending, self.pending_counts, self.pending_plain = [], [], []

    def _rescore(self, moved: Set[str], table: dict[str, float], totals: list[int]) -> bool:
        """The lists that show a document of `moved` rescored with `table`: each one's mask set at
        its moved places first, then its DCGs read from its mask. Whether a sum moved."""
        tops, dcgs, counts, masks, layout = self.tops, self.dcgs, self.counts, self.masks, self.layout
        discounts = layout.discounts
        depth = len(discounts)
        if _NATIVE and depth <= squares_kernel.MAX_DEPTH:
            if self.showing is None and len(tops) >= INDEX_FROM:
                self.showing = {}
                squares_kernel.index_lists(self.showing, tops)
            return squares_kernel.rescore(self.showing, tops, masks, dcgs, counts, moved, table, discounts,
                                          layout.cutoffs, totals)
        stride = len(layout.cutoffs)
        changed = False
        scores: list[float] = []
        terms, ranks = [0.0] * depth, [0] * depth
        # Per cut-off, what the rescorings moved its sum by, held in a pair of doubles (`window_sums.add_exactly`).
        highs, lows = [0.0] * stride, [0.0] * stride
        for number in self._showing(moved):
            top = tops[number]
            mask = masks[number]
            for rank in range(len(top)):
                doc = top[rank]
                if doc is not None and doc in moved:
                    gain = table.get(doc)
                    if gain is not None and gain * discounts[rank] != 0.0:
                        mask |= 1 << rank
                    else:
                        mask &= ~(1 << rank)
            masks[number] = mask
            scores.clear()
            masked_dcgs(top, mask, table, layout, scores, terms, ranks)
            count = counts[number]
            for cut in range(stride):
                old, new = dcgs[number * stride + cut], scores[cut]
                if old != new:
                    dcgs[number * stride + cut] = new
                    changed = True
                    if count == 1:
                        add_exactly(highs, lows, cut, new * new, totals)
                        add_exactly(highs, lows, cut, -(old * old), totals)
                    else:
                        totals[cut] += count * (_square(new) - _square(old))
        for cut in range(stride):
            totals[cut] += exact(highs[cut]) + exact(lows[cut])
        return changed

    def _showing(self, docs: Set[str]) -> Collection[int]:
        """The numbers of the lists taken in that show a document of `docs`, each once: walked in a
        small group, read from the index in a larger one (made on the first ask)."""
        tops = self.tops
        showing = self.showing
        if showing is None:
            if len(tops) < INDEX_FROM:
                return [number for number in range(len(tops)) if not docs.isdisjoint(tops[number])]
            showing = self.showing = {}
            for number in range(len(tops)):
                _index(showing, tops[number], number)
        found: dict[int, None] = {}
        for doc in docs:
            numbers = showing.get(doc)
            if numbers is not None:
                for number in numbers:
                    found[number] = None
        return found.keys()

    def _take_pending(self, table: dict[str, float], totals: list[int]) -> bool:
        """The lists taken since the last `sums`: those new to the group numbered and indexed as
        they come, their impressions counted, and scored together once all are in (a new list shown
        twice holds both). Whether a sum moved."""
        tops, dcgs, counts, layout = self.tops, self.dcgs, self.counts, self.layout
        numbers, showing, depth = self.numbers, self.showing, len(layout.discounts)
        stride = len(layout.cutoffs)
        first_new = len(tops)
        pending, pending_counts, pending_plain = self.pending, self.pending_counts, self.pending_plain
        if _NATIVE and depth <= squares_kernel.MAX_DEPTH:
            changed = squares_kernel.take_pending(numbers, tops, counts, showing, pending, pending_counts,
                                                  pending_plain, dcgs, depth, totals)
            self.pending, self.pending_counts, self.pending_plain = [], [], []
            if len(tops) > first_new:
                changed = squares_kernel.score_new(tops, first_new, table, layout.discounts, layout.cutoffs,
                                                   self.masks, dcgs, counts, totals) or changed
            return changed
        changed = False
        for i in range(len(pending)):
            ranked = pending[i]
            count = pending_counts[i]
            held = numbers.get(ranked, -1)
            if held < 0:
                number = numbers[ranked] = len(tops)
                top: tuple[str | None, ...] = ranked
                if not pending_plain[i] or len(ranked) > depth:
                    top = _top(ranked, depth)
                if showing is not None:
                    _index(showing, top, number)
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
        self.pending, self.pending_counts, self.pending_plain = [], [], []
        if len(tops) > first_new:
            scores = list_dcgs(tops[first_new:], table, layout, self.masks)
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
        return changed


def _index(showing: dict[str | None, list[int]], top: tuple[str | None, ...], number: int) -> None:
    """A list added to a group's index of the lists that show each document. Its number is one
    object, in the list of each document it shows."""
    for doc in top:
        if doc is not None:
            numbers = showing.get(doc)
            if numbers is None:
                showing[doc] = [number]
            else:
                numbers.append(number)
