"""Judgments from clicks, decided at every `interval_ms` boundary of a clock.

Pure: standard library only. A `ClickJudge` reads one ordered stream of
impressions and clicks (one partition's, or a replay file's), joins the clicks
to their impressions (`click_sessions`), counts the impressions whose clicks
are final (`click_models`), and at each boundary B of the clock (a multiple of
`interval_ms`, epoch-aligned) emits a judgment event for each pair whose grade
changed: `ts` = B, `event_id` = "<model>@<B>", `source` = the model's name and
`evidence` its counts, so anyone can check the grade (`ClickJudgment.message`).

The clock is the greatest event time seen (`add`: the event clock), or the one
the caller moves it to (`advance`, then `take` the events: `judge` on the wall
clock, where an event's own time still places its impression in a bucket and
starts its session). With `add`, boundary B is decided when the first
event at or past B arrives, before that event is applied: its grades are those
of the events that arrived before it (all of them earlier than B), with the
impressions whose session ended before B (time + `session_ms` < B), over the
buckets the horizon keeps at B (`windows.oldest_kept_bucket`). When the clock
jumps over several boundaries each is decided in turn (the horizon moves, and
sessions end, between them).

Partitions: a pair's counts live with its query's partition, but COEC's
CTR(r) is every partition's. The grades of B must not depend on how
partitions interleave, so a service decides B in two steps: each partition
`close`s B once its own clock has passed it, then, once every partition is past
B (one whose clock started past B adds nothing), the rank counts of all (`ClickCounts.rank_counts`, summed with
`click_models.summed`) go to each partition's `emit`. A partition that gets no
events would hold every boundary back: `judge_boundaries` says when an idle
partition counts as past B. One stream alone (`add`) is one partition and decides
B at once. `state`, `changes` and `from_state` give the judge's state as plain
data and make a judge of it again (`click_state`).

    judge = ClickJudge(JudgeSettings(Grading("coec", min_impressions=20)))
    for event in events:                 # Impression and Click events, in arrival order
        for judgment in judge.add(event):
            publish(judgment.message())
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stream_ndcg.click_models import ClickCounts, Evidence, Grading, Pair, RankCounts
from stream_ndcg.click_sessions import Sessions
from stream_ndcg.click_state import JudgeState
from stream_ndcg.events import Click, Impression, Judgment
from stream_ndcg.windows import oldest_kept_bucket

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class JudgeSettings:
    """The judge's plain values (durations in ms); `config.Settings` makes them from its settings."""

    grading: Grading = field(default_factory=Grading)
    horizon_ms: int = 14 * DAY_MS
    bucket_ms: int = DAY_MS
    max_rank: int = 20
    session_ms: int = HOUR_MS // 2
    interval_ms: int = HOUR_MS
    dedup_ms: int = HOUR_MS

    def __post_init__(self) -> None:
        if self.bucket_ms < 1 or self.interval_ms < 1 or self.horizon_ms < 0:
            raise ValueError("bucket_ms and interval_ms must be positive, horizon_ms not negative")


class ClickJudgment(NamedTuple):
    """A judgment event derived from clicks."""

    query_id: str
    doc_id: str
    grade: float | None
    ts: int
    event_id: str
    source: str
    evidence: Evidence

    def judgment(self) -> Judgment:
        """The contract's judgment, as `run` applies it."""
        return Judgment(self.query_id, self.doc_id, self.grade, self.ts, self.event_id, self.source)

    def message(self) -> dict[str, Any]:
        """The judgment event to publish, with its `source` (`run` keeps each source's grades
        apart) and `evidence` (checked by `run`, and for people: no grade depends on it)."""
        return {"type": "judgment", "query_id": self.query_id, "doc_id": self.doc_id, "grade": self.grade,
                "ts": self.ts, "event_id": self.event_id, "source": self.source, "evidence": dict(self.evidence)}


class ClickJudge:
    """One stream's click sessions and counts, and the grades it last emitted."""

    def __init__(self, settings: JudgeSettings) -> None:
        self.settings = settings
        self.stats = ClickCounts(settings.max_rank)
        self.sessions = Sessions(max_rank=settings.max_rank, session_ms=settings.session_ms,
                                 dedup_ms=settings.dedup_ms, oldest_bucket=self.oldest_bucket,
                                 bucket_of=self.bucket_of)
        self.clock_ms: int | None = None
        # The last boundary closed (`close`): past the clock while it waits for `emit`.
        self.closed: int | None = None
        # The grade each pair was last given (pairs without one, or retracted, are absent), and the
        # boundary and evidence it was given at: what was published, kept for export and the drill-down.
        self.graded: dict[Pair, float] = {}
        self.given: dict[Pair, tuple[int, Evidence]] = {}
        # The pairs whose grade changed since `changes`.
        self._touched_grades: set[Pair] = set()
        self.boundaries = 0
        self.emitted = 0
        # Whether the counts changed since the last boundary emitted: if not, its grades stand.
        self._changed = False

    @property
    def model(self) -> str:
        return self.settings.grading.model

    def bucket_of(self, ts: int) -> int:
        return ts // self.settings.bucket_ms

    def oldest_bucket(self, clock_ms: int) -> int:
        return oldest_kept_bucket(clock_ms, self.settings.horizon_ms, self.settings.bucket_ms)

    def add(self, event: Impression | Click) -> list[ClickJudgment]:
        """Apply one event: first decide the boundaries its time passes (what they emit is
        returned), then take it in."""
        emitted = self.advance(event.ts)
        self.take(event)
        return emitted

    def take(self, event: Impression | Click) -> None:
        """Take one event in at the clock as it is (its time places it in a bucket, and starts its
        session), without moving the clock: `judge` on the wall clock moves it with `advance`."""
        clock = event.ts if self.clock_ms is None else self.clock_ms
        if isinstance(event, Impression):
            self.sessions.impression(event, clock)
        else:
            self.sessions.click(event, clock)

    def advance(self, to_ms: int) -> list[ClickJudgment]:
        """Move the clock to `to_ms` if that is later, deciding every boundary on the way."""
        if self.clock_ms is None:
            self.clock_ms = to_ms
            return []
        if to_ms <= self.clock_ms:
            return []
        emitted: list[ClickJudgment] = []
        while (boundary := self.due(to_ms)) is not None:
            self.close(boundary)
            emitted.extend(self.emit(boundary))
        self.clock_ms = to_ms
        # Sessions that ended before the new clock are counted now (the next boundary would count
        # them anyway), so that held clicks stop waiting when their time is up.
        self._count_final(to_ms)
        return emitted

    def due(self, to_ms: int) -> int | None:
        """The first boundary the clock would pass moving to `to_ms`, not decided yet (None: none)."""
        if self.clock_ms is None:
            return None
        interval = self.settings.interval_ms
        boundary = (self.clock_ms // interval + 1) * interval
        return boundary if boundary <= to_ms else None

    def next_boundary(self) -> int | None:
        """The first boundary not decided yet (None before any event)."""
        return None if self.clock_ms is None else (self.clock_ms // self.settings.interval_ms + 1) * \
            self.settings.interval_ms

    def close(self, boundary: int) -> None:
        """The counts as boundary `boundary` sees them: the sessions ended before it counted,
        the buckets behind its horizon forgotten."""
        self.closed = boundary
        self._count_final(boundary)
        if self.stats.forget_before(self.oldest_bucket(boundary)):
            self._changed = True

    def emit(self, boundary: int, ctr: RankCounts | None = None) -> list[ClickJudgment]:
        """The judgments of `boundary` for the pairs whose grade changed, after `close`. `ctr`:
        the rank counts of every partition over the horizon's buckets (None: this stream's own).
        The clock moves to the boundary: it is decided."""
        self.boundaries += 1
        self.clock_ms = boundary if self.clock_ms is None else max(self.clock_ms, boundary)
        if ctr is None and not self._changed:
            return []
        self._changed = False
        since = self.oldest_bucket(boundary)
        grading = self.settings.grading
        rates = self.stats.rank_counts(since) if ctr is None else ctr
        emitted = []
        for pair, grade, evidence in self.stats.changes(grading, rates, since, self.graded):
            if grade is None:
                del self.graded[pair]
                del self.given[pair]
            else:
                self.graded[pair] = grade
                self.given[pair] = (boundary, evidence)
            self._touched_grades.add(pair)
            emitted.append(ClickJudgment(pair[0], pair[1], grade, boundary, f"{self.model}@{boundary}", self.model,
                                         evidence))
        self.emitted += len(emitted)
        return emitted

    def count(self, name: str) -> None:
        """Count an event the judge does not take in (`vocabulary`'s keys: a judgment, a rejection)."""
        self.sessions.counts[name] += 1

    def _count_final(self, clock_ms: int) -> None:
        for final in self.sessions.final_before(clock_ms):
            self.stats.add(final, self.bucket_of(final.ts))
            self._changed = True

    def state(self) -> JudgeState:
        """The whole state as plain data (`click_state`); `from_state` makes a judge of it again."""
        sessions, held = self.sessions.states()
        ranks, pairs = self.stats.states()
        return JudgeState(self._meta(), sessions, held, ranks, pairs,
                          {pair: self._graded_state(pair) for pair in self.graded})

    def changes(self) -> JudgeState:
        """What changed since the last call (or since the judge was made), as plain data: the
        scalars whole, the rest by key, a removal as None."""
        touched, touched_held = self.sessions.take_touched()
        ranks, pairs, forgotten = self.stats.take_touched()
        grades, self._touched_grades = self._touched_grades, set()
        return JudgeState(
            self._meta(), {i: self.sessions.session_state(i) for i in touched},
            {i: self.sessions.held_state(i) for i in touched_held}, {b: self.stats.rank_state(b) for b in ranks},
            {(b, pair): self.stats.pair_state(b, pair) for b, pair in pairs if b in self.stats.ranks},
            {pair: self._graded_state(pair) if pair in self.graded else None for pair in grades}, forgotten)

    def _graded_state(self, pair: Pair) -> list[Any]:
        """A pair's grade as stored: [grade, boundary, {evidence}], the judgment last published."""
        boundary, evidence = self.given[pair]
        return [self.graded[pair], boundary, dict(evidence)]

    @classmethod
    def from_state(cls, settings: JudgeSettings, state: JudgeState) -> ClickJudge:
        """A judge that goes on as the one whose `state` (or state merged with its changes) was saved."""
        judge = cls(settings)
        meta = state.meta
        if meta:
            judge.clock_ms, judge.closed = meta["clock_ms"], meta["closed"]
            judge.boundaries, judge.emitted, judge._changed = meta["boundaries"], meta["emitted"], meta["changed"]
            judge.sessions.restore(state.sessions, state.held, meta["serial"], meta["counts"])
        judge.stats.restore(state.ranks, state.pairs)
        for pair, graded in state.graded.items():
            if graded is not None:
                judge.graded[pair] = graded[0]
                judge.given[pair] = (graded[1], tuple(graded[2].items()))
        return judge

    def _meta(self) -> dict[str, Any]:
        return {"clock_ms": self.clock_ms, "closed": self.closed, "boundaries": self.boundaries,
                "emitted": self.emitted, "changed": self._changed, "serial": self.sessions.serial,
                "counts": dict(self.sessions.counts)}

    def summary(self) -> dict[str, Any]:
        """What the judge did, for people: its model, boundaries, judgments, grades and counts."""
        grades = Counter(self.graded.values())
        return {"model": self.model, "boundaries": self.boundaries, "judgments": self.emitted,
                "graded": {f"{grade:g}": n for grade, n in sorted(grades.items())},
                "clock_ms": self.clock_ms, "open_impressions": self.sessions.open,
                "held_clicks": self.sessions.held, "events": dict(sorted(self.sessions.counts.items()))}
