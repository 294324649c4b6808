"""The incremental engine: applies events to per-query state and yields aggregate deltas.

Pure: no I/O, standard library only. A store loads the `QueryState` of the
queries a batch touches, the engine mutates them and returns what changed, and
the store writes that back (atomically, with the consumed offsets, in the
service). The engine never walks impressions: impressions of one query in one
time bucket and one segment form a `Group` that keeps each distinct ranked
list once, with a count, and an index of where each document stands in them.
Nor does it walk a group's places on an event: each group keeps its sums as it
changes (`group_sums`; `list_terms` under the list ideal; `list_squares` for
the sums of squares), so an impression costs its list's places, a judgment
the places its document is shown and the distinct lists that show it, and
under the pool ideal a moved ideal a division per group of the query. Only a
group read afresh from the store is walked whole, once.

Aggregates are flat sums keyed by (bucket, segment key, field), the fields
and the event counts named in `vocabulary`; `windows` turns them into means.
The stored form of the state is `state.format`'s, not the engine's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from sys import intern

from stream_ndcg.events import Click, Event, Impression, InvalidEvent, Judgment
from stream_ndcg.group_sums import GroupSums
from stream_ndcg.list_terms import ListTerms
from stream_ndcg.metric import Measure, pooled_ndcg, pooled_totals
from stream_ndcg.query_state import Group, QueryState, Revision, revision_of
from stream_ndcg.rows import Row, group_row
from stream_ndcg.vocabulary import (
    CLICK,
    IMPRESSION,
    IMPRESSIONS,
    JUDGMENT,
    MOMENTS,
    TOO_OLD,
    UNLISTED_SOURCE,
    AggregateKey,
    Segment,
    dcg_squares_at,
    duplicate,
    full_segment_key,
    judgment_from,
    ndcg_squares_at,
    rejected,
)
from stream_ndcg.windows import oldest_kept_bucket

# A document's judgment events older than this many judgment max ages are forgotten (its winner
# is kept): any of them delivered again is rejected as too old before it could be found a
# duplicate, so forgetting changes no outcome (unless the max age is later raised more than
# twofold: docs/service.md, "Windows and clock"), and a live query's events stop growing. Two,
# not one: under the wall clock, an instance whose clock is behind the one that forgot them (by
# less than a max age) still rejects them.
FORGET_AFTER_MAX_AGES = 2

SegmentKeyFn = Callable[[Segment], str]


@dataclass(init=False)
class QueryChange:
    """What a batch did to one query's state, so that a store writes only that."""

    # Groups that took impressions in the batch.
    groups: set[tuple[int, str]]
    # Documents whose current grade moved.
    docs: set[str]
    # The grade each of them had before the batch (None: none): what the groups' kept sums were
    # kept with (`group_sums`).
    before: dict[str, float | None]
    # The judgment events the batch added, per document (its grade may or may not have moved).
    revised: dict[str, list[Revision]]
    # Documents whose old judgment events were dropped (`Engine._judgment`): stored whole again.
    pruned: set[str]
    # Groups to write back: the new impressions' and every re-credited one.
    dirty: set[tuple[int, str]]
    # Groups dropped behind the horizon.
    removed: set[tuple[int, str]]

    def __init__(self) -> None:
        # Each made here rather than by default factories, which the compiled core calls as Python
        # callables: one of these is made for every query a batch touches.
        self.groups, self.docs, self.before, self.revised = set(), set(), {}, {}
        self.pruned, self.dirty, self.removed = set(), set(), set()


@dataclass
class BatchOutcome:
    """What one batch of events changed."""

    touched: dict[str, QueryState] = field(default_factory=dict)
    changes: dict[str, QueryChange] = field(default_factory=dict)
    aggregates: dict[AggregateKey, float] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    # impression id -> the bucket the store remembers it from (`Engine._impression`).
    impression_buckets: dict[str, int] = field(default_factory=dict)
    # (query, bucket, segment, list) -> impressions that showed it in this batch.
    lists: dict[tuple[str, int, str, tuple[str, ...]], int] = field(default_factory=dict)
    # (query, bucket, segment) -> the drill-down row of each group written back (`rows.group_row`).
    rows: dict[tuple[str, int, str], Row] = field(default_factory=dict)
    # query -> (bucket, segment, field) -> what the batch credited, with `Engine(query_credits=True)`:
    # the aggregates' changes by query, which experiments keep per query (`experiments.cell_changes`).
    query_credits: dict[str, dict[AggregateKey, float]] = field(default_factory=dict)
    clock_ms: int | None = None


class Engine:
    """Applies events to query states, keeping every group's credit exact.

        engine = Engine(Measure(cutoffs=(10,)), bucket_ms=60_000)
        outcome = engine.apply(events, states, known_impressions={}, now_ms=...)

    Counts use the keys of `vocabulary`: accepted events by type, duplicates by type and
    rejections by reason, and judgments also by source. A click is counted and nothing else: it
    neither touches a query's state nor moves the event clock, so a topic carrying clicks gives
    the numbers of the same topic without them (the click models read clicks: `click_models`). So
    is a judgment of a source the measure does not list (`Measure.sources`): another pipeline on
    the same topic may take it.
    """

    def __init__(
        self,
        measure: Measure,
        bucket_ms: int = 60_000,
        *,
        horizon_ms: int | None = None,
        judgment_max_age_ms: int | None = None,
        dedup_horizon_ms: int | None = None,
        segment_key: SegmentKeyFn = full_segment_key,
        drilldown: bool = True,
        query_credits: bool = False,
    ) -> None:
        if bucket_ms < 1:
            raise ValueError("bucket_ms must be positive")
        self.measure = measure
        # The deepest rank the measure reads (a property of the measure's, found once here).
        self.depth = measure.depth
        self.bucket_ms = bucket_ms
        self.horizon_ms = horizon_ms
        self.judgment_max_age_ms = judgment_max_age_ms
        # How long behind the clock an accepted impression's id makes a resend of it a duplicate
        # (None: as long as the store remembers it).
        self.dedup_horizon_ms = dedup_horizon_ms
        self.segment_key = segment_key
        # Whether to write each re-credited group's drill-down row (`BatchOutcome.rows`).
        self.drilldown = drilldown
        # Whether to report the credits by query too (`BatchOutcome.query_credits`).
        self.query_credits = query_credits

    def bucket_of(self, ts: int) -> int:
        return ts // self.bucket_ms

    def apply(
        self,
        events: Iterable[Event | InvalidEvent],
        states: Mapping[str, QueryState],
        known_impressions: dict[str, int],
        now_ms: int | None = None,
        *,
        event_clock: bool = False,
    ) -> BatchOutcome:
        """Apply events in order. `states` must hold every query the events name
        (a missing one starts empty); `known_impressions` the impression ids
        already applied, with the bucket of each (the engine adds the batch's).
        `now_ms` drives expiry, too-old rejections and the dedup horizon (None:
        none of them); with `event_clock` it advances to each event's time, so
        which events count depends on their order, never on batch boundaries
        (only when groups behind every window are dropped does). The clock
        reached is `outcome.clock_ms`."""
        outcome = BatchOutcome(clock_ms=now_ms)
        for event in events:
            if isinstance(event, InvalidEvent):
                outcome.counts[rejected(event.reason)] += 1
                continue
            if isinstance(event, Click):
                outcome.counts[CLICK] += 1
                continue
            if isinstance(event, Judgment) and event.source not in self.measure.sources:
                outcome.counts[UNLISTED_SOURCE] += 1
                continue
            if event_clock and (now_ms is None or event.ts > now_ms):
                now_ms = outcome.clock_ms = event.ts
            state = outcome.touched.get(event.query_id)
            if state is None:
                state = states.get(event.query_id) or QueryState()
                outcome.touched[event.query_id] = state
                outcome.changes[event.query_id] = QueryChange()
                if now_ms is not None:
                    self._expire(state, now_ms, outcome.changes[event.query_id])
            if isinstance(event, Impression):
                self._impression(event, state, known_impressions, now_ms, outcome, outcome.changes[event.query_id])
            else:
                self._judgment(event, state, now_ms, outcome, outcome.changes[event.query_id])
        # Credit once per batch, not once per event: a head query's group may
        # take hundreds of impressions in one batch.
        for query_id, change in outcome.changes.items():
            state = outcome.touched[query_id]
            credits = outcome.query_credits.setdefault(query_id, {}) if self.query_credits else None
            self._recredit(state, change, outcome.aggregates, credits)
            if change.dirty and self.drilldown:
                grades = state.grades(self.measure.sources)
                for bucket, segment in change.dirty & state.groups.keys():
                    outcome.rows[(query_id, bucket, segment)] = group_row(
                        state.groups[(bucket, segment)], grades, self.measure.cutoffs)
        return outcome

    def _impression(
        self,
        event: Impression,
        state: QueryState,
        known: dict[str, int],
        now_ms: int | None,
        outcome: BatchOutcome,
        todo: QueryChange,
    ) -> None:
        seen = known.get(event.impression_id)
        if seen is not None and self._remembered(seen, now_ms):
            outcome.counts[duplicate(IMPRESSION)] += 1
            return
        if now_ms is not None and self.horizon_ms is not None and event.ts < now_ms - self.horizon_ms:
            outcome.counts[rejected(TOO_OLD)] += 1
            return
        bucket = self.bucket_of(event.ts)
        # An id is remembered from the clock's bucket when it is accepted, or from its own if that
        # is later: an impression that arrives late (a backlog, a rebuild) is still remembered for
        # the dedup horizon, not forgotten at once for being old.
        remembered_from = bucket if now_ms is None else max(bucket, self.bucket_of(now_ms))
        known[event.impression_id] = remembered_from
        outcome.impression_buckets[event.impression_id] = remembered_from
        outcome.counts[IMPRESSION] += 1
        key = (bucket, self.segment_key(event.segment))
        group = state.groups.get(key)
        if group is None:
            group = state.groups[key] = Group(lists_stored=self.measure.ideal == "list")
        group.impressions += 1
        # One copy of each document id for every list that shows it, however many impressions
        # brought it (each parsed event has its own strings): what a group holds is mostly its lists.
        ranked = tuple(map(intern, event.results[: self.depth]))
        group.add_list(ranked, 1, self.depth)
        listed = (event.query_id, bucket, key[1], ranked)
        outcome.lists[listed] = outcome.lists.get(listed, 0) + 1
        todo.groups.add(key)

    def _remembered(self, bucket: int, now_ms: int | None) -> bool:
        """Whether an impression id remembered from `bucket` still makes a resend a duplicate: the
        dedup horizon rule, checked here and not only by the stores' pruning, so that a batch's
        boundaries never decide it."""
        if now_ms is None or self.dedup_horizon_ms is None:
            return True
        return bucket >= oldest_kept_bucket(now_ms, self.dedup_horizon_ms, self.bucket_ms)

    def _judgment(
        self,
        event: Judgment,
        state: QueryState,
        now_ms: int | None,
        outcome: BatchOutcome,
        todo: QueryChange,
    ) -> None:
        if (now_ms is not None and self.judgment_max_age_ms is not None
                and event.ts < now_ms - self.judgment_max_age_ms):
            outcome.counts[rejected(TOO_OLD)] += 1
            return
        revision = revision_of(event)
        moved = state.add_revision(event.doc_id, revision, self.measure.sources)
        if moved is None:
            outcome.counts[duplicate(JUDGMENT)] += 1
            return
        outcome.counts[JUDGMENT] += 1
        outcome.counts[judgment_from(event.source)] += 1
        todo.revised.setdefault(event.doc_id, []).append(revision)
        if moved[0] != moved[1]:
            todo.docs.add(event.doc_id)
            todo.before.setdefault(event.doc_id, moved[0])
        if now_ms is not None and self.judgment_max_age_ms is not None and state.forget_revisions(
                event.doc_id, now_ms - FORGET_AFTER_MAX_AGES * self.judgment_max_age_ms):
            todo.pruned.add(event.doc_id)

    def _expire(self, state: QueryState, now_ms: int, change: QueryChange) -> None:
        """Drop the groups behind the horizon: their buckets are behind every
        window, so nothing is un-credited. Judgments stay while the query is
        alive (less those `QueryState.forget_revisions` drops); the store
        expires a query's whole state after its last event."""
        if self.horizon_ms is not None:
            oldest = oldest_kept_bucket(now_ms, self.horizon_ms, self.bucket_ms)
            for key in [key for key in state.groups if key[0] < oldest]:
                del state.groups[key]
                change.removed.add(key)

    def _recredit(self, state: QueryState, todo: QueryChange, aggregates: dict[AggregateKey, float],
                  credits: dict[AggregateKey, float] | None = None) -> None:
        """Re-credit the groups that new impressions or grade changes can move: each by what changed
        in it (`group_sums`), and under the pool ideal every other one renormalised if the ideal moved;
        each difference also into `credits` when given (the query's own, for the experiments)."""
        if not todo.groups and not todo.docs:
            return
        grades = state.grades(self.measure.sources)
        pool = self.measure.ideal == "pool"
        gains, ideals, renormalise = state.pool_gains(self.measure, todo.docs) if pool else (grades, {}, False)
        # What the groups' kept sums were kept with, in the same terms as `gains` (grades under the list
        # ideal, whose kept sums need only know which documents are judged).
        gain_of = self.measure.gain_of
        before: dict[str, float | None] = {doc: None if grade is None else gain_of(grade)
                                           for doc, grade in todo.before.items()} if pool else todo.before
        todo.dirty.update(todo.groups)
        # Every group once per state read from the store (one stored before the sums of squares may
        # take them in) and whenever a grade moved (under the pool ideal each is renormalised if
        # the ideal moved: a look at each, not at its places); else only those that took impressions.
        walk = bool(todo.docs) or not state.walked
        looked_at = list(state.groups.items()) if walk else [
            (key, state.groups[key]) for key in todo.groups if key in state.groups]
        state.walked = True
        for key, group in looked_at:
            if (key in todo.groups or (todo.docs and any(doc in group.ranks for doc in todo.docs))
                    or (MOMENTS not in group.credited and group.lists_complete())):
                # New impressions or a grade of one of its documents, or a group stored before the
                # sums of squares were kept whose lists are all known: it takes them in (`state.format`).
                sums = self._sync(group, gains, before, todo.docs)
                totals = self._totals(group, sums, grades, gains, ideals, todo.docs, before)
            elif renormalise:
                totals = pooled_ndcg(dict(group.credited), group.impressions, ideals)
            else:
                continue
            if self._credit(key, group, totals, aggregates, credits):
                todo.dirty.add(key)

    def _sync(self, group: Group, gains: dict[str, float], before: dict[str, float | None],
              moved: set[str]) -> GroupSums:
        """The group's kept sums, brought up to its places and the query's gains (made once, afresh,
        for a group read from the store or kept for another measure)."""
        made_with = (self.measure.gain, self.measure.ideal)
        sums = group.sums
        if sums is None or sums.key != made_with or sums.cutoffs != self.measure.cutoffs:
            sums = group.sums = GroupSums(group, gains, self.measure.cutoffs, self.measure.ideal == "pool", made_with)
        else:
            sums.sync(group, gains, before, moved)
        return sums

    def _totals(self, group: Group, sums: GroupSums, grades: dict[str, float], gains: dict[str, float],
                ideals: dict[int, float], moved: set[str], before: dict[str, float | None]) -> dict[str, float]:
        """The group's sums, from its kept `sums` and, under the list ideal, its lists
        scored with the query's grades (and, under the pool ideal, their `gains`; `moved`: the
        documents whose grade moved since it was last, `before` what they had then)."""
        totals: dict[str, float] = {IMPRESSIONS: float(group.impressions)}
        # Without all its lists (a group of an older state format, or one whose bucket's lists the
        # store could not read), a group's squares are unknown.
        complete = group.lists_complete()
        if self.measure.ideal == "list":
            terms = group.terms
            if terms is None or terms.key != self.measure or terms.lists_of is not group.lists:
                terms = group.terms = ListTerms(group.lists, grades, self.measure)
                moved = set()
            totals.update(terms.sync(group.lists, grades, self.measure, moved))
            for k in () if complete else self.measure.cutoffs:
                del totals[dcg_squares_at(k)], totals[ndcg_squares_at(k)]
        else:
            dcgs, judged = sums.totals()
            cutoffs = self.measure.cutoffs
            squares = group.squares.sums(group.lists, gains, cutoffs, moved, before) if complete else None
            pooled_totals(cutoffs, dcgs, judged, group.impressions, ideals, squares, totals)
        if complete:
            totals[MOMENTS] = float(group.impressions)
        return totals

    @staticmethod
    def _credit(
        key: tuple[int, str],
        group: Group,
        totals: dict[str, float],
        aggregates: dict[AggregateKey, float],
        credits: dict[AggregateKey, float] | None = None,
    ) -> bool:
        """Add the difference to the aggregates (and to `credits`, the query's, if given); whether
        there was any."""
        bucket, segment = key
        changed = False
        credited = group.credited
        for name, value in totals.items():
            change = value - credited.get(name, 0.0)
            if change:
                aggregates[(bucket, segment, name)] = aggregates.get((bucket, segment, name), 0.0) + change
                if credits is not None:
                    credits[(bucket, segment, name)] = credits.get((bucket, segment, name), 0.0) + change
                changed = True
        for name, value in credited.items():
            # A figure it credited and no longer has (its squares, once its lists are not all known)
            # is taken back.
            if value and name not in totals:
                aggregates[(bucket, segment, name)] = aggregates.get((bucket, segment, name), 0.0) - value
                if credits is not None:
                    credits[(bucket, segment, name)] = credits.get((bucket, segment, name), 0.0) - value
                changed = True
        group.credited = totals
        return changed

