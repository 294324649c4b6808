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
from collections.abc import Iterable, Mapping, Set
from typing import Protocol

from stream_ndcg.metric import discount, first_occurrences
from stream_ndcg.window_sums import exact, rounded

# A judged document's gain (a document not in it is not judged).
GainOf = Mapping[str, float]
# Per cut-off, the most exposure one unjudged document holds, and which (None: none).
Top = tuple[tuple[float, str | None], ...]
# The gains the sums were kept with, of the documents whose grade moved since: None, not judged.
GainsBefore = Mapping[str, float | None]


class Placed(Protocol):
    """What a `GroupSums` reads of its group (`query_state.Group`)."""

    ranks: dict[str, dict[int, int]]

    def shown_at(self) -> dict[int, int]: ...


@functools.cache
def rank_table(cutoffs: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
    """Per rank up to the largest cut-off: the positions of the cut-offs that reach it, and its discount."""
    return (tuple(tuple(i for i, k in enumerate(cutoffs) if 0 < rank <= k) for rank in range(max(cutoffs) + 1)),
            tuple(discount(rank) if rank else 0.0 for rank in range(max(cutoffs) + 1)))


class GroupSums:
    """One group's sums, as of the gains it was last synced with (`sync`)."""

    # Few attributes and no list per figure: a cache holds one of these per group, and each object
    # the collector walks costs every full collection.
    __slots__ = ("key", "cutoffs", "table", "pooled", "sums", "unjudged_at", "pending", "top")

    def __init__(self, group: Placed, gains: GainOf, cutoffs: tuple[int, ...], pooled: bool,
                 key: object = None) -> None:
        """Everything found once from the group's places: a group read afresh from the store. `key`:
        what the gains were made with (a measure's), for the caller to know the sums its own."""
        self.key = key
        self.cutoffs = cutoffs
        self.table = rank_table(cutoffs)
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
        deepest = max(cutoffs)
        for doc, at in group.ranks.items():
            gain = gains.get(doc)
            for rank, count in at.items():
                if rank <= deepest:
                    self._place(gain, rank, 0, count)

    def sync(self, group: Placed, gains: GainOf, before: GainsBefore, moved: Set[str]) -> None:
        """Take in the impressions added since the last sync, with the gains the sums were kept with
        (`before` for the documents whose grade moved since, `gains` for the others), then the moves
        of `moved`: each place of a moved document's term replaced."""
        deepest = max(self.cutoffs)
        grown: list[str] = []
        ranks = group.ranks
        unjudged_at = self.unjudged_at
        # (document, rank) -> impressions added there, of the judged places: each one's term moves once.
        judged: dict[tuple[str, int], int] = {}
        for ranked, count in self.pending:
            for rank, doc in first_occurrences(ranked, deepest):
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
            elif self.top is not None and any(doc == held for _, held in self.top):
                self.top = None
        if self.top is not None:
            self._offer([doc for doc in dict.fromkeys(grown) if doc not in gains], ranks)

    def _place(self, gain: float | None, rank: int, was: int, now: int) -> None:
        """The impressions at one place of one document went from `was` to `now`."""
        if gain is None:
            self.unjudged_at[rank] = self.unjudged_at.get(rank, 0) + now - was
            return
        reach, weights = self.table
        sums = self.sums
        if self.pooled:
            # As `pooled_sums` forms each term: gain * count, then * discount.
            term = exact(gain * now * weights[rank]) - (exact(gain * was * weights[rank]) if was else 0)
            for i in reach[rank]:
                sums[i] += term
        width = len(self.cutoffs)
        for i in reach[rank]:
            sums[width + i] += now - was

    def _offer(self, docs: Iterable[str], ranks: Mapping[str, Mapping[int, int]]) -> Top:
        """Unjudged documents whose exposure grew, or that became unjudged: the most one holds may be
        theirs. A document's exposure is summed over its ranks in their order in `ranks`, so that it
        is the same number however it was reached."""
        width = len(self.cutoffs)
        reach, weights = self.table
        deepest = len(weights) - 1
        top = list(self.top or [(0.0, None)] * width)
        for doc in docs:
            at = ranks[doc]
            if len(at) == 1:
                # Most documents stand at one rank of a group: their exposure is one term.
                ((rank, count),) = at.items()
                if rank <= deepest:
                    held = count * weights[rank]
                    for i in reach[rank]:
                        if held > top[i][0]:
                            top[i] = (held, doc)
                continue
            sums = [0.0] * width
            for rank, count in at.items():
                if rank <= deepest:
                    weight = count * weights[rank]
                    for i in reach[rank]:
                        sums[i] += weight
            for i in range(width):
                if sums[i] > top[i][0]:
                    top[i] = (sums[i], doc)
        self.top = tuple(top)
        return self.top

    def totals(self) -> tuple[list[float], list[int]]:
        """Per cut-off: the DCG sum (rounded once) and the impressions of judged documents within it."""
        width = len(self.cutoffs)
        return [rounded(total) for total in self.sums[:width]], self.sums[width:]

    def exposure(self, group: Placed, gains: GainOf) -> tuple[float, ...]:
        """Per cut-off: the group's top-k exposure, the part unjudged documents hold, and the most
        one unjudged document holds (`rows.group_row` writes them)."""
        cutoffs = self.cutoffs
        shown = group.shown_at()
        reach, weights = self.table
        # Rank by rank, from the top: each figure the same number however its counts came.
        exposure = [0.0] * len(cutoffs)
        unjudged = [0.0] * len(cutoffs)
        for rank in range(1, len(weights)):
            count = shown.get(rank)
            if count:
                weight = count * weights[rank]
                for i in reach[rank]:
                    exposure[i] += weight
            count = self.unjudged_at.get(rank)
            if count:
                weight = count * weights[rank]
                for i in reach[rank]:
                    unjudged[i] += weight
        top = self.top
        if top is None:
            top = self._offer([doc for doc in group.ranks if doc not in gains], group.ranks)
        return tuple(value for i in range(len(cutoffs)) for value in (exposure[i], unjudged[i], top[i][0]))
