"""A group's pool-ideal DCG and judged sums and its exposure figures, kept as lists come and grades move.

Pure, standard library only. `metric.pooled_sums` finds a group's sums from every place a judged
document is shown in it, and `query_state.Group.exposure` its exposure from every document; doing
either again whenever the group takes an impression would cost in proportion to its pairs. So a
`GroupSums` keeps them, and each change costs only what it touches: an impression its list's
places (`Group.add_list` leaves the list for `sync`), a grade that moved the places its document
is shown in the group.

Exact by construction, never by luck: every DCG sum is kept as a whole number of 2**-1074 (as
`list_squares` keeps the squares), each of its terms the same double `pooled_sums` sums (gain *
count * discount of one place), so a term taken out is the one put in and the sum, rounded once
when asked for, is `pooled_sums`'s fsum bit for bit however the lists and grades came. The judged
counts and the impressions with an unjudged document at each rank are integers, and the
exposure figures are computed from those integers when asked for (a few ranks), so no value is
ever the end of a chain of float additions.

The one walk over a group's documents left: the most exposure one unjudged document holds is a
maximum, which a document's judgment can take away; when the document holding it is judged, the
maximum is found again on the next read (`exposure`), and so it is on a group's first read. Each
document's exposure is summed over its ranks in their order in the group's index, the same
number whether found then or when the document's impressions grew.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Protocol

from stream_ndcg.metric import discount
from stream_ndcg.window_sums import exact, rounded

# A judged document's gain (a document not in it is not judged). Dicts, not mappings, here and
# below: the compiled core reads a dict in place, a mapping through its methods.
GainOf = dict[str, float]
# Per cut-off, the most exposure one unjudged document holds, and which (None: none).
Top = tuple[tuple[float, str | None], ...]
# The gains the sums were kept with, of the documents whose grade moved since: None, not judged.
GainsBefore = dict[str, float | None]
# doc -> {first rank -> impressions showing it there}: a group's index (`query_state.Group.ranks`).
Ranks = dict[str, dict[int, int]]


class Placed(Protocol):
    """What a `GroupSums` reads of its group (`query_state.Group`)."""

    ranks: Ranks

    def shown_at(self) -> dict[int, int]: ...


def repeats_in(ranked: tuple[str, ...], depth: int) -> set[str] | None:
    """An empty set to gather the documents seen in a walk of the first `depth` ranks, when some
    repeats there; None for the usual list, which repeats nothing: each of its ranks is a first
    occurrence (`metric.first_occurrences`), and a walk of it needs no set."""
    top = ranked if len(ranked) <= depth else ranked[:depth]
    return None if len(set(top)) == len(top) else set()


def index_list(ranks: Ranks, shown: dict[int, int] | None, ranked: tuple[str, ...], count: int,
               depth: int) -> bool:
    """`count` impressions of `ranked` added to a group's index (`query_state.Group.add_list`), and
    to its impressions by rank when it keeps them (`shown`); whether it repeats no document within
    `depth` (`repeats_in`)."""
    seen = repeats_in(ranked, depth)
    rank = 0
    for doc in ranked:
        rank += 1
        if rank > depth:
            break
        if seen is not None:
            if doc in seen:
                continue
            seen.add(doc)
        at = ranks.get(doc)
        if at is None:
            ranks[doc] = {rank: count}
        else:
            at[rank] = at.get(rank, 0) + count
        if shown is not None:
            shown[rank] = shown.get(rank, 0) + count
    return seen is None


def shown_by_rank(ranks: Ranks) -> dict[int, int]:
    """rank -> impressions with a document there: the ranks of a group's index summed over documents."""
    shown: dict[int, int] = {}
    for at in ranks.values():
        for rank, count in at.items():
            shown[rank] = shown.get(rank, 0) + count
    return shown


@functools.cache
def rank_table(cutoffs: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
    """Per rank up to the largest cut-off: the positions of the cut-offs that reach it, and its discount."""
    return (tuple(tuple(i for i, k in enumerate(cutoffs) if 0 < rank <= k) for rank in range(max(cutoffs) + 1)),
            tuple(discount(rank) if rank else 0.0 for rank in range(max(cutoffs) + 1)))


class GroupSums:
    """One group's sums, as of the gains it was last synced with (`sync`)."""

    # Few attributes and no list per figure: a cache holds one of these per group, and each object
    # the collector walks costs every full collection.
    __slots__ = ("key", "cutoffs", "reach", "weights", "pooled", "sums", "unjudged_at", "pending", "top")

    def __init__(self, group: Placed, gains: GainOf, cutoffs: tuple[int, ...], pooled: bool,
                 key: object = None) -> None:
        """Everything found once from the group's places: a group read afresh from the store. `key`:
        what the gains were made with (a measure's), for the caller to know the sums its own."""
        self.key = key
        self.cutoffs = cutoffs
        # Per rank, the positions of the cut-offs that reach it, and its discount (`rank_table`).
        self.reach, self.weights = rank_table(cutoffs)
        # Whether the DCG sums are kept (the pool ideal's); the exposure figures always are.
        self.pooled = pooled
        # Per cut-off the exact DCG sum, then per cut-off the impressions of judged documents within it.
        self.sums = [0] * (2 * len(cutoffs))
        # rank -> impressions with an unjudged document there.
        self.unjudged_at: dict[int, int] = {}
        # The lists the group took since the last `sync`, with their counts (`Group.add_list`).
        self.pending: list[tuple[tuple[str, ...], int]] = []
        # Per cut-off, the most exposure one unjudged document holds, and which; None: to be found
        # (the document holding one was judged, or nothing was read yet).
        self.top: Top | None = None
        deepest = len(self.weights) - 1
        for doc, at in group.ranks.items():
            gain = gains.get(doc)
            for rank, count in at.items():
                if rank <= deepest:
                    self._place(gain, rank, 0, count)

    def sync(self, group: Placed, gains: GainOf, before: GainsBefore, moved: set[str]) -> None:
        """Take in the impressions added since the last sync, with the gains the sums were kept with
        (`before` for the documents whose grade moved since, `gains` for the others), then the moves
        of `moved`: each place of a moved document's term replaced."""
        deepest = len(self.weights) - 1
        grown: list[str] = []
        ranks = group.ranks
        # (document, rank) -> impressions added there, of the judged places: each one's term moves once.
        judged: dict[tuple[str, int], int] = {}
        unjudged_at = self.unjudged_at
        for ranked, count in self.pending:
            # The first occurrences walked in place, as `index_list` walks them: a generator of
            # (rank, document) pairs would cost the compiled core an object per place.
            seen = repeats_in(ranked, deepest)
            rank = 0
            for doc in ranked:
                rank += 1
                if rank > deepest:
                    break
                if seen is not None:
                    if doc in seen:
                        continue
                    seen.add(doc)
                if (before.get(doc) if doc in moved else gains.get(doc)) is None:
                    unjudged_at[rank] = unjudged_at.get(rank, 0) + count
                    grown.append(doc)
                else:
                    judged[(doc, rank)] = judged.get((doc, rank), 0) + count
        self.pending = []
        for (doc, rank), count in judged.items():
            now = ranks[doc][rank]
            self._place(before.get(doc) if doc in moved else gains.get(doc), rank, now - count, now)
        for doc in moved:
            at = ranks.get(doc)
            if at is None:
                continue
            old, new = before.get(doc), gains.get(doc)
            if old == new:
                continue
            for rank, count in at.items():
                if rank <= deepest:
                    self._place(old, rank, count, 0)
                    self._place(new, rank, 0, count)
            if new is None:
                grown.append(doc)
            elif self.top is not None and self._holds(doc):
                self.top = None
        if self.top is not None and grown:
            self._offer([doc for doc in dict.fromkeys(grown) if doc not in gains], ranks)

    def _holds(self, doc: str) -> bool:
        """Whether `doc` holds the most exposure at some cut-off (`top`)."""
        for _, held in self.top or ():
            if held == doc:
                return True
        return False

    def _place(self, gain: float | None, rank: int, was: int, now: int) -> None:
        """The impressions at one place of one document went from `was` to `now`."""
        if gain is None:
            self.unjudged_at[rank] = self.unjudged_at.get(rank, 0) + now - was
            return
        reach = self.reach[rank]
        sums = self.sums
        if self.pooled:
            # As `pooled_sums` forms each term: gain * count, then * discount.
            weight = self.weights[rank]
            term = exact(gain * now * weight) - (exact(gain * was * weight) if was else 0)
            for i in reach:
                sums[i] += term
        width = len(self.cutoffs)
        for i in reach:
            sums[width + i] += now - was

    def _offer(self, docs: list[str], ranks: Ranks) -> Top:
        """Unjudged documents whose exposure grew, or that became unjudged: the most one holds may be
        theirs. A document's exposure is summed over its ranks in their order in `ranks`, so that it
        is the same number however it was reached."""
        width = len(self.cutoffs)
        reach, weights = self.reach, self.weights
        deepest = len(weights) - 1
        most: list[float] = [0.0] * width
        holders: list[str | None] = [None] * width
        if self.top is not None:
            for i in range(width):
                most[i], holders[i] = self.top[i]
        sums: list[float] = [0.0] * width
        for doc in docs:
            at = ranks[doc]
            if len(at) == 1:
                # Most documents stand at one rank of a group: their exposure is one term.
                for rank, count in at.items():
                    if rank <= deepest:
                        held = count * weights[rank]
                        for i in reach[rank]:
                            if held > most[i]:
                                most[i], holders[i] = held, doc
                continue
            for i in range(width):
                sums[i] = 0.0
            for rank, count in at.items():
                if rank <= deepest:
                    weight = count * weights[rank]
                    for i in reach[rank]:
                        # Written out, not +=: the compiled core adds a list's floats in place only so.
                        sums[i] = sums[i] + weight
            for i in range(width):
                if sums[i] > most[i]:
                    most[i], holders[i] = sums[i], doc
        top = self.top = tuple([(most[i], holders[i]) for i in range(width)])
        return top

    def totals(self) -> tuple[list[float], list[int]]:
        """Per cut-off: the DCG sum (rounded once) and the impressions of judged documents within it."""
        width = len(self.cutoffs)
        return [rounded(total) for total in self.sums[:width]], self.sums[width:]

    def exposure(self, group: Placed, gains: Mapping[str, float]) -> tuple[float, ...]:
        """Per cut-off: the group's top-k exposure, the part unjudged documents hold, and the most
        one unjudged document holds (`rows.group_row` writes them)."""
        width = len(self.cutoffs)
        shown = group.shown_at()
        reach, weights = self.reach, self.weights
        unjudged_at = self.unjudged_at
        # Rank by rank, from the top: each figure the same number however its counts came.
        exposure: list[float] = [0.0] * width
        unjudged: list[float] = [0.0] * width
        for rank in range(1, len(weights)):
            count = shown.get(rank, 0)
            if count:
                weight = count * weights[rank]
                for i in reach[rank]:
                    exposure[i] = exposure[i] + weight
            count = unjudged_at.get(rank, 0)
            if count:
                weight = count * weights[rank]
                for i in reach[rank]:
                    unjudged[i] = unjudged[i] + weight
        top = self.top
        if top is None:
            top = self._offer([doc for doc in group.ranks if doc not in gains], group.ranks)
        figures: list[float] = []
        for i in range(width):
            figures += (exposure[i], unjudged[i], top[i][0])
        return tuple(figures)
