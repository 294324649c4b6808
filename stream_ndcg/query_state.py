"""The state the engine keeps per query: judgment revisions per document and impression groups.

Pure, standard library only. A `QueryState` holds every distinct judgment event of each of
its documents, of every judgment source (the greatest by `precedence` of each source is that
source's grade, and the first source of the measure's `sources` with a grade gives the
document's: `effective_grade`), and its impressions as `Group`s: one per time bucket and
segment, each distinct ranked list once, with a count, and an index of where each document
stands. The engine (`engine`) changes them; the state store (`state.format`) writes and reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stream_ndcg.events import Judgment, revision_precedence
from stream_ndcg.list_squares import ListSquares
from stream_ndcg.metric import discount, first_occurrences

# (ts, event_id, grade, source): one judgment event of a (query, document) pair.
Revision = tuple[int, str | None, float | None, str]


def precedence(revision: Revision) -> tuple[int, bool, str, bool, float]:
    """`revision_precedence` of a stored revision (within its source)."""
    return revision_precedence(revision[0], revision[1], revision[2])


def revision_of(judgment: Judgment) -> Revision:
    return (judgment.ts, judgment.event_id, judgment.grade, judgment.source)


def effective_grade(winners: Mapping[str, Revision], sources: Sequence[str]) -> tuple[float, str] | None:
    """The grade of the first of `sources` whose greatest revision grades the document, with that
    source; None when none does (a retraction leaves its source without a grade, so the next fills in)."""
    for source in sources:
        winner = winners.get(source)
        if winner is not None and winner[2] is not None:
            return winner[2], source
    return None


@dataclass
class Group:
    """The impressions of one query in one time bucket and one segment."""

    impressions: int = 0
    # Each distinct list with its count: the list ideal scores list by list, and under the pool
    # ideal the sums of squares need each list's own DCG.
    lists: dict[tuple[str, ...], int] = field(default_factory=dict)
    # Whether the stored group holds its lists: under the pool ideal they are read from the
    # bucket's lists, which the store keeps anyway (for drill-down), rather than written twice.
    lists_stored: bool = field(default=True, repr=False, compare=False)
    # Under the pool ideal, its lists' DCGs and the sums of their squares, kept up to date.
    squares: ListSquares = field(default_factory=ListSquares, repr=False, compare=False)
    # What this group has added to the aggregates, per field: the engine adds
    # the difference whenever it recomputes the group.
    credited: dict[str, float] = field(default_factory=dict)
    # doc -> {first rank -> impressions showing it there}: all the pool ideal needs.
    ranks: dict[str, dict[int, int]] = field(default_factory=dict)
    # rank -> impressions with a document there: the ranks summed over documents, derived on first
    # use and then kept up to date (`shown_at`).
    _shown_at: dict[int, int] | None = field(default=None, repr=False, compare=False)
    # Its exposure figures (`exposure`): they depend on the ranks and on which of the group's
    # documents are judged, so they are kept until new impressions come or the engine says a grade
    # of one of its documents moved (`forget_exposure`). Under the pool ideal most groups a
    # judgment rewrites are renormalised only, and reuse them.
    _exposure: tuple[float, ...] | None = field(default=None, repr=False, compare=False)
    # How many times the ranks changed: what a reader that keeps something derived from them (the
    # stored form, `state.format`) compares to know it is still theirs.
    ranks_changes: int = field(default=0, repr=False, compare=False)

    def add_list(self, ranked: tuple[str, ...], count: int, depth: int) -> None:
        self.ranks_changes += 1
        self._exposure = None
        self.lists[ranked] = self.lists.get(ranked, 0) + count
        self.squares.added(ranked, count)
        shown = self._shown_at
        for rank, doc in first_occurrences(ranked, depth):
            at = self.ranks.setdefault(doc, {})
            at[rank] = at.get(rank, 0) + count
            if shown is not None:
                shown[rank] = shown.get(rank, 0) + count

    def shown_at(self) -> dict[int, int]:
        """rank -> how many of the group's impressions show a document there."""
        if self._shown_at is None:
            shown: dict[int, int] = {}
            for at in self.ranks.values():
                for rank, count in at.items():
                    shown[rank] = shown.get(rank, 0) + count
            self._shown_at = shown
        return self._shown_at

    def forget_exposure(self) -> None:
        """A grade of one of its documents moved: its exposure figures are computed again."""
        self._exposure = None

    def exposure(self, grades: Mapping[str, float], cutoffs: tuple[int, ...]) -> tuple[float, ...]:
        """Per cut-off: the group's top-k exposure, the part unjudged documents hold, and the most
        one unjudged document holds (`rows.group_row` writes them)."""
        if self._exposure is None:
            self._exposure = _exposure(self, grades, cutoffs)
        return self._exposure


@dataclass
class QueryState:
    """Everything the engine knows about one query."""

    # Every distinct judgment event seen per document, of every source (so that one seen again is
    # known as a duplicate), less those forgotten (FORGET_AFTER_MAX_AGES); the greatest of each
    # source by `precedence` is that source's grade.
    revisions: dict[str, list[Revision]] = field(default_factory=dict)
    groups: dict[tuple[int, str], Group] = field(default_factory=dict)
    # The greatest revision per document and source, found once and then kept up to date: a head
    # query collects thousands of judgment events, and each new one is compared with its source's
    # winner only.
    _winners: dict[str, dict[str, Revision]] = field(default_factory=dict, repr=False, compare=False)
    # The current grades, and the order of sources they were found with.
    _grades: dict[str, float] | None = field(default=None, repr=False, compare=False)
    _grades_sources: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def winners(self, doc: str) -> dict[str, Revision]:
        """The document's greatest revision of each source that judged it (shared: do not change it)."""
        winners = self._winners.get(doc)
        if winners is None:
            winners = {}
            for revision in self.revisions[doc]:
                held = winners.get(revision[3])
                if held is None or precedence(revision) > precedence(held):
                    winners[revision[3]] = revision
            self._winners[doc] = winners
        return winners

    def grades(self, sources: tuple[str, ...]) -> dict[str, float]:
        """The current grade of each graded document, by the first of `sources` that grades it."""
        if self._grades is None or self._grades_sources != sources:
            current: dict[str, float] = {}
            for doc in self.revisions:
                found = effective_grade(self.winners(doc), sources)
                if found is not None:
                    current[doc] = found[0]
            self._grades, self._grades_sources = current, sources
        return self._grades

    def add_revision(self, doc: str, revision: Revision,
                     sources: tuple[str, ...]) -> tuple[float | None, float | None] | None:
        """Record a judgment event; None if it was seen before, else the document's grade (by
        `sources`) before and after."""
        seen = self.revisions.get(doc)
        source = revision[3]
        if seen is None:
            self.revisions[doc] = [revision]
            winners = self._winners[doc] = {source: revision}
            before = None
        else:
            winners = self.winners(doc)
            held = winners.get(source)
            newer = held is None or precedence(revision) > precedence(held)
            # Every event of a source seen ranks at most its winner: only an older one needs the search.
            if not newer and revision in seen:
                return None
            seen.append(revision)
            found = effective_grade(winners, sources)
            before = None if found is None else found[0]
            if newer:
                winners[source] = revision
        found = effective_grade(winners, sources)
        after = None if found is None else found[0]
        if self._grades is not None and self._grades_sources != sources:
            self._grades = None
        elif self._grades is not None and after != before:
            if after is None:
                del self._grades[doc]
            else:
                self._grades[doc] = after
        return before, after

    def forget_revisions(self, doc: str, before_ts: int) -> bool:
        """Drop the document's events older than `before_ts`, except each source's winner; whether
        any went. Only the two seen first are looked at before the whole list is walked: events
        arrive roughly in time order, so an old one is near the front."""
        seen = self.revisions[doc]
        if all(revision[0] >= before_ts for revision in seen[:2]):
            return False
        winners = self.winners(doc).values()
        kept = [revision for revision in seen if revision[0] >= before_ts or revision in winners]
        if len(kept) == len(seen):
            return False
        self.revisions[doc] = kept
        return True


def _exposure(group: Group, grades: Mapping[str, float], cutoffs: tuple[int, ...]) -> tuple[float, ...]:
    """Per cut-off: the group's exposure, the part unjudged documents hold, the most one holds."""
    width = len(cutoffs)
    order, weights = _rank_table(cutoffs)
    # The exposure of all documents is the impressions at each rank discounted (`Group.shown_at`,
    # kept up to date), so only the unjudged documents are walked one by one. Each rank's weight is
    # looked up once, and the cut-offs a rank reaches are a prefix of them sorted largest first.
    exposure = [0.0] * width
    shown = group.shown_at()
    for rank in range(1, len(weights)):
        count = shown.get(rank)
        if count:
            weight = count * weights[rank]
            for i in order:
                if rank > cutoffs[i]:
                    break
                exposure[i] += weight
    unjudged = [0.0] * width
    top = [0.0] * width
    deepest = len(weights) - 1
    for at in [at for doc, at in group.ranks.items() if doc not in grades]:
        held = [0.0] * width
        for rank, count in at.items():
            if rank > deepest:
                continue
            weight = count * weights[rank]
            for i in order:
                if rank > cutoffs[i]:
                    break
                held[i] += weight
        for i in range(width):
            unjudged[i] += held[i]
            if held[i] > top[i]:
                top[i] = held[i]
    return tuple(value for i in range(width) for value in (exposure[i], unjudged[i], top[i]))


@functools.cache
def _rank_table(cutoffs: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The cut-offs' positions from the largest down, and the discount of every rank up to it."""
    return (tuple(sorted(range(len(cutoffs)), key=lambda i: -cutoffs[i])),
            tuple(discount(rank) if rank else 0.0 for rank in range(max(cutoffs) + 1)))
