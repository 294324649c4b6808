"""A group's pool-ideal DCG and judged sums and its exposure figures, kept as lists come and grades move.

Pure, standard library only. `metric.pooled_sums` finds a group's sums from every place a judged
document is shown in it, and `query_state.Group.exposure` its exposure from every document; doing
either again whenever the group takes an impression would cost in proportion to its pairs. So a
`GroupSums` keeps them, and each change costs only what it touches: an impression its list's
places (`added`, then `sync`), a grade that moved the places its document is shown in the group.

Exact by construction, never by luck: every DCG sum is kept as a whole number of 2**-1074 (as
`list_squares` keeps the squares), each of its terms the same double `pooled_sums` sums (gain *
count * discount of one place), so a term taken out is the one put in and the sum, rounded once
when asked for, is `pooled_sums`'s fsum bit for bit however the lists and grades came. The judged
counts and the impressions with an unjudged document at each rank are integers, and the
exposure figures are computed from those integers when asked for (a few ranks), so no value is
ever the end of a chain of float additions.

The one walk over a group's documents left: the most exposure one unjudged document holds is a
maximum, which a document's judgment can take away; when the document holding it is judged, the
maximum is found again on the next read (`exposure`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Set
from typing import Protocol

from stream_ndcg.metric import discount
from stream_ndcg.window_sums import exact, rounded

# A judged document's gain (a document not in it is not judged).
GainOf = Mapping[str, float]
# The gains the sums were kept with, of the documents whose grade moved since: None, not judged.
GainsBefore = Mapping[str, float | None]


class Placed(Protocol):
    """What a `GroupSums` reads of its group (`query_state.Group`)."""

    ranks: dict[str, dict[int, int]]

    def shown_at(self) -> dict[int, int]: ...


@functools.cache
def rank_table(cutoffs: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The cut-offs' positions from the largest down, and the discount of every rank up to it."""
    return (tuple(sorted(range(len(cutoffs)), key=lambda i: -cutoffs[i])),
            tuple(discount(rank) if rank else 0.0 for rank in range(max(cutoffs) + 1)))


def discounted_by_cutoff(counts: Mapping[int, int], cutoffs: tuple[int, ...]) -> list[float]:
    """Per cut-off: the sum over ranks r <= k of counts[r] * discount(r), in the order of `counts`."""
    order, weights = rank_table(cutoffs)
    deepest = len(weights) - 1
    sums = [0.0] * len(cutoffs)
    for rank, count in counts.items():
        if rank > deepest or not count:
            continue
        weight = count * weights[rank]
        for i in order:
            if rank > cutoffs[i]:
                break
            sums[i] += weight
    return sums


class GroupSums:
    """One group's sums, as of the gains it was last synced with (`sync`)."""

    __slots__ = ("key", "cutoffs", "pooled", "dcg", "judged", "unjudged_at", "pending", "top", "top_doc", "stale")

    def __init__(self, group: Placed, gains: GainOf, cutoffs: tuple[int, ...], pooled: bool,
                 key: object = None) -> None:
        """Everything found once from the group's places: a group read afresh from the store. `key`:
        what the gains were made with (a measure's), for the caller to know the sums its own."""
        self.key = key
        self.cutoffs = cutoffs
        # Whether the DCG sums are kept (the pool ideal's); the exposure figures always are.
        self.pooled = pooled
        width = len(cutoffs)
        # Per cut-off: the exact DCG sum, and the impressions of judged documents within it.
        self.dcg = [0] * width
        self.judged = [0] * width
        # rank -> impressions with an unjudged document there.
        self.unjudged_at: dict[int, int] = {}
        # (document, rank) -> impressions the group took there since the last `sync`.
        self.pending: dict[tuple[str, int], int] = {}
        self.top = [0.0] * width
        self.top_doc: list[str | None] = [None] * width
        # Whether the document holding a maximum was judged: found again on the next read.
        self.stale = True
        deepest = max(cutoffs)
        for doc, at in group.ranks.items():
            gain = gains.get(doc)
            for rank, count in at.items():
                if rank <= deepest:
                    self._place(gain, rank, 0, count)

    def added(self, doc: str, rank: int, count: int) -> None:
        """The group took `count` impressions showing `doc` at `rank` (its places already counted)."""
        key = (doc, rank)
        self.pending[key] = self.pending.get(key, 0) + count

    def sync(self, group: Placed, gains: GainOf, before: GainsBefore, moved: Set[str]) -> None:
        """Take in the impressions added since the last sync, with the gains the sums were kept with
        (`before` for the documents whose grade moved since, `gains` for the others), then the moves
        of `moved`: each place of a moved document's term replaced."""
        deepest = max(self.cutoffs)
        candidates: set[str] = set()
        ranks = group.ranks
        for (doc, rank), count in self.pending.items():
            if rank > deepest:
                continue
            gain = before.get(doc) if doc in moved else gains.get(doc)
            now = ranks[doc][rank]
            self._place(gain, rank, now - count, now)
            if gain is None:
                candidates.add(doc)
        self.pending = {}
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
                candidates.add(doc)
            elif doc in self.top_doc:
                self.stale = True
        if not self.stale:
            for doc in candidates:
                if doc not in gains:
                    self._offer(doc, ranks[doc])

    def _place(self, gain: float | None, rank: int, was: int, now: int) -> None:
        """The impressions at one place of one document went from `was` to `now`."""
        if gain is None:
            self.unjudged_at[rank] = self.unjudged_at.get(rank, 0) + now - was
            return
        cutoffs = self.cutoffs
        if self.pooled:
            # As `pooled_sums` forms each term: gain * count, then * discount.
            term = exact(gain * now * discount(rank)) - exact(gain * was * discount(rank))
            for i, k in enumerate(cutoffs):
                if rank <= k:
                    self.dcg[i] += term
        for i, k in enumerate(cutoffs):
            if rank <= k:
                self.judged[i] += now - was

    def _offer(self, doc: str, at: Mapping[int, int]) -> None:
        """An unjudged document's exposure grew, or it became unjudged: the most one holds may be it."""
        held = discounted_by_cutoff(at, self.cutoffs)
        for i, value in enumerate(held):
            if value > self.top[i]:
                self.top[i], self.top_doc[i] = value, doc

    def sums(self) -> tuple[list[float], list[int]]:
        """Per cut-off: the DCG sum (rounded once) and the impressions of judged documents within it."""
        return [rounded(total) for total in self.dcg], list(self.judged)

    def exposure(self, group: Placed, gains: GainOf) -> tuple[float, ...]:
        """Per cut-off: the group's top-k exposure, the part unjudged documents hold, and the most
        one unjudged document holds (`rows.group_row` writes them)."""
        cutoffs = self.cutoffs
        shown = group.shown_at()
        exposure = discounted_by_cutoff({rank: shown[rank] for rank in sorted(shown)}, cutoffs)
        unjudged = discounted_by_cutoff({rank: self.unjudged_at[rank] for rank in sorted(self.unjudged_at)},
                                        cutoffs)
        if self.stale:
            self.top, self.top_doc, self.stale = [0.0] * len(cutoffs), [None] * len(cutoffs), False
            for doc, at in group.ranks.items():
                if doc not in gains:
                    self._offer(doc, at)
        return tuple(value for i in range(len(cutoffs)) for value in (exposure[i], unjudged[i], self.top[i]))
