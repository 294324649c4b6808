"""The state the engine keeps per query: judgment revisions per document and impression groups.

Pure, standard library only. A `QueryState` holds every distinct judgment event of each of
its documents, of every judgment source (the greatest by `precedence` of each source is that
source's grade, and the first source of the measure's `sources` with a grade gives the
document's: `effective_grade`), and its impressions as `Group`s: one per time bucket and
segment, each distinct ranked list once, with a count, and an index of where each document
stands. The engine (`engine`) changes them; the state store (`state.format`) writes and reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stream_ndcg.events import Judgment, revision_precedence
from stream_ndcg.group_sums import GroupSums, index_list, shown_by_rank
from stream_ndcg.list_squares import ListSquares
from stream_ndcg.list_terms import ListTerms
from stream_ndcg.metric import Measure, ideal_dcg

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
    # Under the list ideal, its lists' scores and the sums of their terms, kept up to date.
    terms: ListTerms | None = field(default=None, repr=False, compare=False)
    # Its sums kept as it changes (`group_sums`): made by the engine on its first re-credit, and
    # told of every place added since (`add_list`).
    sums: GroupSums | None = field(default=None, repr=False, compare=False)
    # The impressions its lists count (None: not counted yet), so that whether it holds every list
    # it counts (`lists_complete`) is known without summing them. Summed once, on the first ask,
    # then moved by `add_list` alone: a store gives a group its lists when it reads it, before the
    # engine asks, and every list added after goes through `add_list`.
    _listed: int | None = field(default=None, repr=False, compare=False)
    # How many times the ranks changed: what a reader that keeps something derived from them (the
    # stored form, `state.format`) compares to know it is still theirs.
    ranks_changes: int = field(default=0, repr=False, compare=False)

    def add_list(self, ranked: tuple[str, ...], count: int, depth: int) -> None:
        self.ranks_changes += 1
        self.lists[ranked] = self.lists.get(ranked, 0) + count
        if self._listed is not None:
            self._listed += count
        # The places' loop is the compiled core's (`group_sums`): this class stays interpreted, as the
        # stores' caches take weak references to it.
        plain = index_list(self.ranks, self._shown_at, ranked, count, depth)
        self.squares.added(ranked, count, plain)
        if self.terms is not None:
            self.terms.added(ranked, count)
        if self.sums is not None:
            self.sums.pending.append((ranked, count))

    def lists_complete(self) -> bool:
        """Whether the group holds every list it counts: what its sums of squares are made of."""
        if self._listed is None:
            self._listed = sum(self.lists.values())
        return self._listed == self.impressions

    def shown_at(self) -> dict[int, int]:
        """rank -> how many of the group's impressions show a document there."""
        if self._shown_at is None:
            self._shown_at = shown_by_rank(self.ranks)
        return self._shown_at

    def exposure(self, grades: Mapping[str, float], cutoffs: tuple[int, ...]) -> tuple[float, ...]:
        """Per cut-off: the group's top-k exposure, the part unjudged documents hold, and the most
        one unjudged document holds (`rows.group_row` writes them): its kept sums' when the engine
        keeps them, else found from its places (a group read back from its stored form)."""
        sums = self.sums
        if sums is None or sums.cutoffs != cutoffs:
            # The engine's grades are a dict, which the compiled sums read in place.
            sums = GroupSums(self, grades if isinstance(grades, dict) else dict(grades), cutoffs, pooled=False)
        return sums.exposure(self, grades)


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
    # Under the pool ideal, the engine's gains of the graded documents and ideal DCGs, with what
    # they were made with: kept up to date by the documents whose grade moves, never found again
    # for every batch.
    pool: tuple[object, dict[str, float], dict[int, float]] | None = field(default=None, repr=False, compare=False)
    # Whether the engine has looked at every group of this state once (`Engine._recredit`).
    walked: bool = field(default=False, repr=False, compare=False)

    def pool_gains(self, measure: Measure, moved: set[str]) -> tuple[dict[str, float], dict[int, float], bool]:
        """The gains of the graded documents and the pool ideal DCGs, kept here (`pool`) and moved
        by the documents whose grade `moved`; and whether the groups must be renormalised (the
        ideal moved, or is not known to have stayed)."""
        made_with = (measure.sources, measure.gain, measure.cutoffs)
        grades = self.grades(measure.sources)
        if self.pool is None or self.pool[0] != made_with:
            gains = {doc: measure.gain_of(grade) for doc, grade in grades.items()}
            ideals = {k: ideal_dcg(gains.values(), k) for k in measure.cutoffs}
            self.pool = (made_with, gains, ideals)
            return gains, ideals, bool(moved)
        _, gains, ideals = self.pool
        if not moved:
            return gains, ideals, False
        for doc in moved:
            grade = grades.get(doc)
            if grade is None:
                gains.pop(doc, None)
            else:
                gains[doc] = measure.gain_of(grade)
        # The k largest gains: a walk over the query's judged documents (not its groups' places),
        # once per batch that moves a grade.
        moved_ideals = {k: ideal_dcg(gains.values(), k) for k in measure.cutoffs}
        self.pool = (made_with, gains, moved_ideals)
        return gains, moved_ideals, moved_ideals != ideals

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
