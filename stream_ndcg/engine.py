"""The incremental engine: applies events to per-query state and yields aggregate deltas.

Pure: no I/O, standard library only. A store loads the `QueryState` of the
queries a batch touches, the engine mutates them and returns what changed, and
the store writes that back (atomically, with the consumed offsets, in the
service). The engine never walks impressions: impressions of one query in one
time bucket and one segment form a `Group` that keeps each distinct ranked
list once, with a count, and an index of where each document stands in them.
A judgment therefore costs in proportion to the query's groups and the
distinct lists that show the document, never to its raw impressions.

Aggregates are flat sums keyed by (bucket, segment key, field); the fields are
``impressions`` and, for each cut-off k, ``scored@k`` (impressions with a
defined nDCG), ``dcg@k``, ``ndcg@k`` and ``judged@k`` (sums over impressions).
A window mean is the fsum of a field over the window's buckets divided by the
fsum of its denominator.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_ndcg.events import Event, Impression, InvalidEvent, Judgment, revision_precedence
from stream_ndcg.metric import Measure, discount, first_occurrences, ideal_dcg, score_list

# (ts, event_id, grade): one judgment event of a (query, document) pair.
Revision = tuple[int, str | None, float | None]
AggregateKey = tuple[int, str, str]
SegmentKeyFn = Callable[[tuple[tuple[str, str], ...]], str]


@functools.lru_cache(maxsize=4096)
def full_segment_key(segment: tuple[tuple[str, str], ...]) -> str:
    """Group by the whole segment map (the replay's and the tests' choice)."""
    return json.dumps(dict(segment), sort_keys=True, separators=(",", ":"))


def precedence(revision: Revision) -> tuple[int, bool, str, bool, float]:
    """`revision_precedence` of a stored revision."""
    return revision_precedence(*revision)


def revision_of(judgment: Judgment) -> Revision:
    return (judgment.ts, judgment.event_id, judgment.grade)


@dataclass
class Group:
    """The impressions of one query in one time bucket and one segment."""

    impressions: int = 0
    # Each distinct list with its count; kept here only for the list ideal,
    # which scores list by list (the store keeps them all for drill-down).
    lists: dict[tuple[str, ...], int] = field(default_factory=dict)
    # What this group has added to the aggregates, per field: the engine adds
    # the difference whenever it recomputes the group.
    credited: dict[str, float] = field(default_factory=dict)
    # doc -> {first rank -> impressions showing it there}: all the pool ideal needs.
    ranks: dict[str, dict[int, int]] = field(default_factory=dict)

    def add_list(self, ranked: tuple[str, ...], count: int, depth: int, *, keep_list: bool) -> None:
        if keep_list:
            self.lists[ranked] = self.lists.get(ranked, 0) + count
        for rank, doc in first_occurrences(ranked, depth):
            at = self.ranks.setdefault(doc, {})
            at[rank] = at.get(rank, 0) + count

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.impressions,
            "c": self.credited,
            "r": self.ranks,
            "l": [[list(ranked), count] for ranked, count in self.lists.items()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        return cls(
            impressions=data["n"],
            credited=data["c"],
            # JSON object keys are strings: the ranks come back as text.
            ranks={doc: {int(rank): count for rank, count in at.items()} for doc, at in data["r"].items()},
            lists={tuple(ranked): count for ranked, count in data["l"]},
        )


@dataclass
class QueryState:
    """Everything the engine knows about one query."""

    # Every distinct judgment event seen per document (so that one seen again is known as a
    # duplicate); the greatest by `precedence` is the document's grade.
    revisions: dict[str, list[Revision]] = field(default_factory=dict)
    groups: dict[tuple[int, str], Group] = field(default_factory=dict)
    # The greatest revision per document, found once and then kept up to date: a head query
    # collects thousands of judgment events, and each new one is compared with the winner only.
    _winners: dict[str, Revision] = field(default_factory=dict, repr=False, compare=False)
    _grades: dict[str, float] | None = field(default=None, repr=False, compare=False)

    def _winner(self, doc: str) -> Revision:
        winner = self._winners.get(doc)
        if winner is None:
            winner = self._winners[doc] = max(self.revisions[doc], key=precedence)
        return winner

    def grades(self) -> dict[str, float]:
        """The current grade of each judged document (retracted ones left out)."""
        if self._grades is None:
            current: dict[str, float] = {}
            for doc in self.revisions:
                grade = self._winner(doc)[2]
                if grade is not None:
                    current[doc] = grade
            self._grades = current
        return self._grades

    def add_revision(self, doc: str, revision: Revision) -> tuple[float | None, float | None] | None:
        """Record a judgment event; None if it was seen before, else the document's grade before and after."""
        seen = self.revisions.get(doc)
        if seen is None:
            self.revisions[doc] = [revision]
            before, winner = None, revision
        else:
            previous = self._winner(doc)
            newer = precedence(revision) > precedence(previous)
            # Every event seen ranks at most the winner: only an older one needs the search.
            if not newer and revision in seen:
                return None
            seen.append(revision)
            before, winner = previous[2], revision if newer else previous
        self._winners[doc] = winner
        after = winner[2]
        if self._grades is not None and after != before:
            if after is None:
                del self._grades[doc]
            else:
                self._grades[doc] = after
        return before, after

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; stores choose the codec."""
        return {"r": self.revisions, "g": [[b, s, g.to_dict()] for (b, s), g in self.groups.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueryState:
        state = cls(revisions={doc: [(r[0], r[1], r[2]) for r in seen] for doc, seen in data["r"].items()})
        for bucket, segment, group in data["g"]:
            state.groups[(bucket, segment)] = Group.from_dict(group)
        return state

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> QueryState:
        return cls.from_dict(json.loads(text))


@dataclass
class QueryChange:
    """What a batch did to one query's state, so that a store writes only that."""

    # Groups that took impressions in the batch.
    groups: set[tuple[int, str]] = field(default_factory=set)
    # Documents whose current grade moved.
    docs: set[str] = field(default_factory=set)
    # The judgment events the batch added, per document (its grade may or may not have moved).
    revised: dict[str, list[Revision]] = field(default_factory=dict)
    # Groups to write back: the new impressions' and every re-credited one.
    dirty: set[tuple[int, str]] = field(default_factory=set)
    # Groups dropped behind the horizon.
    removed: set[tuple[int, str]] = field(default_factory=set)


@dataclass
class BatchOutcome:
    """What one batch of events changed."""

    touched: dict[str, QueryState] = field(default_factory=dict)
    changes: dict[str, QueryChange] = field(default_factory=dict)
    aggregates: dict[AggregateKey, float] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    impression_buckets: dict[str, int] = field(default_factory=dict)
    # (query, bucket, segment, list) -> impressions that showed it in this batch.
    lists: dict[tuple[str, int, str, tuple[str, ...]], int] = field(default_factory=dict)
    clock_ms: int | None = None


class Engine:
    """Applies events to query states, keeping every group's credit exact.

        engine = Engine(Measure(cutoffs=(10,)), bucket_ms=60_000)
        outcome = engine.apply(events, states, known_impressions=set(), now_ms=...)

    Counts use the keys ``impression``, ``judgment``, ``duplicate:<type>`` and
    ``rejected:<reason>``.
    """

    def __init__(
        self,
        measure: Measure,
        bucket_ms: int = 60_000,
        *,
        horizon_ms: int | None = None,
        judgment_max_age_ms: int | None = None,
        segment_key: SegmentKeyFn = full_segment_key,
    ) -> None:
        if bucket_ms < 1:
            raise ValueError("bucket_ms must be positive")
        self.measure = measure
        self.bucket_ms = bucket_ms
        self.horizon_ms = horizon_ms
        self.judgment_max_age_ms = judgment_max_age_ms
        self.segment_key = segment_key

    def bucket_of(self, ts: int) -> int:
        return ts // self.bucket_ms

    def apply(
        self,
        events: Iterable[Event | InvalidEvent],
        states: Mapping[str, QueryState],
        known_impressions: set[str],
        now_ms: int | None = None,
        *,
        event_clock: bool = False,
    ) -> BatchOutcome:
        """Apply events in order. `states` must hold every query the events name
        (a missing one starts empty); `known_impressions` the impression ids
        already applied. `now_ms` drives expiry and too-old rejections (None:
        neither); with `event_clock` it advances to each event's time, so which
        events count depends on their order, never on batch boundaries (only
        when groups behind every window are dropped does). The clock reached is
        `outcome.clock_ms`."""
        outcome = BatchOutcome(clock_ms=now_ms)
        for event in events:
            if isinstance(event, InvalidEvent):
                outcome.counts[f"rejected:{event.reason}"] += 1
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
            self._recredit(outcome.touched[query_id], change, outcome.aggregates)
        return outcome

    def _impression(
        self,
        event: Impression,
        state: QueryState,
        known: set[str],
        now_ms: int | None,
        outcome: BatchOutcome,
        todo: QueryChange,
    ) -> None:
        if event.impression_id in known:
            outcome.counts["duplicate:impression"] += 1
            return
        if now_ms is not None and self.horizon_ms is not None and event.ts < now_ms - self.horizon_ms:
            outcome.counts["rejected:too_old"] += 1
            return
        known.add(event.impression_id)
        bucket = self.bucket_of(event.ts)
        outcome.impression_buckets[event.impression_id] = bucket
        outcome.counts["impression"] += 1
        key = (bucket, self.segment_key(event.segment))
        group = state.groups.get(key)
        if group is None:
            group = state.groups[key] = Group()
        group.impressions += 1
        ranked = event.results[: self.measure.depth]
        group.add_list(ranked, 1, self.measure.depth, keep_list=self.measure.ideal == "list")
        outcome.lists[(event.query_id, bucket, key[1], ranked)] = (
            outcome.lists.get((event.query_id, bucket, key[1], ranked), 0) + 1)
        todo.groups.add(key)

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
            outcome.counts["rejected:too_old"] += 1
            return
        revision = revision_of(event)
        moved = state.add_revision(event.doc_id, revision)
        if moved is None:
            outcome.counts["duplicate:judgment"] += 1
            return
        outcome.counts["judgment"] += 1
        todo.revised.setdefault(event.doc_id, []).append(revision)
        if moved[0] != moved[1]:
            todo.docs.add(event.doc_id)

    def _expire(self, state: QueryState, now_ms: int, change: QueryChange) -> None:
        """Drop the groups behind the horizon: their buckets are behind every
        window, so nothing is un-credited. Judgments stay while the query is
        alive; the store expires a query's whole state after its last event."""
        if self.horizon_ms is not None:
            oldest = self.bucket_of(now_ms - self.horizon_ms)
            for key in [key for key in state.groups if key[0] < oldest]:
                del state.groups[key]
                change.removed.add(key)

    def _recredit(self, state: QueryState, todo: QueryChange, aggregates: dict[AggregateKey, float]) -> None:
        """Re-credit the groups that new impressions or grade changes can move."""
        if not todo.groups and not todo.docs:
            return
        grades = state.grades()
        ideals = self._ideals(grades)
        renormalise = bool(todo.docs) and self.measure.ideal == "pool"
        todo.dirty.update(todo.groups)
        for key, group in state.groups.items():
            if key in todo.groups or not todo.docs.isdisjoint(group.ranks):
                totals = self._totals(group, grades, ideals)
            elif renormalise:
                totals = self._normalised(dict(group.credited), group.impressions, ideals)
            else:
                continue
            if self._credit(key, group, totals, aggregates):
                todo.dirty.add(key)

    def _ideals(self, grades: Mapping[str, float]) -> dict[int, float]:
        if self.measure.ideal != "pool":
            return {}
        gains = [self.measure.gain_of(g) for g in grades.values()]
        return {k: ideal_dcg(gains, k) for k in self.measure.cutoffs}

    def _totals(self, group: Group, grades: Mapping[str, float], ideals: Mapping[int, float]) -> dict[str, float]:
        """The group's sums, recomputed from its lists and the query's grades."""
        totals: dict[str, float] = {"impressions": float(group.impressions)}
        if self.measure.ideal == "list":
            per_list = [(score_list(ranked, grades, self.measure), count) for ranked, count in group.lists.items()]
            for k in self.measure.cutoffs:
                totals[f"dcg@{k}"] = math.fsum(s.dcg[k] * c for s, c in per_list)
                totals[f"ndcg@{k}"] = math.fsum((s.ndcg[k] or 0.0) * c for s, c in per_list)
                totals[f"scored@{k}"] = float(sum(c for s, c in per_list if s.ndcg[k] is not None))
                totals[f"judged@{k}"] = math.fsum(s.judged_ratio[k] * c for s, c in per_list)
            return totals
        # One pass over (judged document, rank): its gain-weighted discount and count
        # go to every cut-off at or beyond the rank.
        cutoffs = self.measure.cutoffs
        terms: dict[int, list[float]] = {k: [] for k in cutoffs}
        counts = dict.fromkeys(cutoffs, 0)
        for doc, at in group.ranks.items():
            grade = grades.get(doc)
            if grade is None:
                continue
            gain = self.measure.gain_of(grade)
            for rank, count in at.items():
                term = gain * count * discount(rank)
                for k in cutoffs:
                    if rank <= k:
                        terms[k].append(term)
                        counts[k] += count
        for k in cutoffs:
            totals[f"dcg@{k}"] = math.fsum(terms[k])
            totals[f"judged@{k}"] = counts[k] / k
        return self._normalised(totals, group.impressions, ideals)

    def _normalised(self, totals: dict[str, float], impressions: int, ideals: Mapping[int, float]) -> dict[str, float]:
        for k in self.measure.cutoffs:
            ideal = ideals[k]
            totals[f"ndcg@{k}"] = totals[f"dcg@{k}"] / ideal if ideal > 0.0 else 0.0
            totals[f"scored@{k}"] = float(impressions) if ideal > 0.0 else 0.0
        return totals

    @staticmethod
    def _credit(
        key: tuple[int, str],
        group: Group,
        totals: dict[str, float],
        aggregates: dict[AggregateKey, float],
    ) -> bool:
        """Add the difference to the aggregates; whether there was any."""
        bucket, segment = key
        changed = False
        for name, value in totals.items():
            change = value - group.credited.get(name, 0.0)
            if change:
                aggregates[(bucket, segment, name)] = aggregates.get((bucket, segment, name), 0.0) + change
                changed = True
        group.credited = totals
        return changed


def window_means(
    aggregates: Mapping[AggregateKey, float],
    cutoffs: Iterable[int],
    buckets: Callable[[int], bool] = lambda _: True,
) -> dict[str, dict[str, float | None]]:
    """Per cut-off, the sums and means over the aggregate buckets that `buckets` admits, all
    segments of `aggregates` together; a mean with nothing to average is None."""
    parts: dict[str, list[float]] = {}
    for (bucket, _, name), value in aggregates.items():
        if buckets(bucket):
            parts.setdefault(name, []).append(value)
    # fsum: a total does not depend on the order its parts were added in.
    sums = {name: math.fsum(values) for name, values in parts.items()}
    impressions = sums.get("impressions", 0.0)
    means: dict[str, dict[str, float | None]] = {}
    for k in cutoffs:
        scored, ndcg, dcg, judged = (sums.get(f"{name}@{k}", 0.0) for name in ("scored", "ndcg", "dcg", "judged"))
        means[str(k)] = {
            "ndcg_mean": ndcg / scored if scored else None,
            "dcg_mean": dcg / impressions if impressions else None,
            "judged_ratio": judged / impressions if impressions else None,
            "ndcg_sum": ndcg,
            "dcg_sum": dcg,
            "judged_sum": judged,
            "scored_impressions": scored,
            "impressions": impressions,
        }
    return means
