"""Clicks joined to their impressions: which clicks count, and when an impression's clicks are final.

Pure: standard library only. The click models (`click_models`) count impressions
with their clicks once they are final; this module decides what that means, by
the clock it is given (the greatest event time, as `run`'s event clock):

- An impression is *open* from its arrival until the clock passes its time plus
  `session_ms` (`click_session`); then its clicks are final and it is handed
  over (`Sessions.final_before`), PyClick's convention for fitting cascade
  models by counting, here applied to both models alike.
- A click joins its impression by `impression_id`. The document's rank is its
  first position in the impression's results. A click is rejected with its own
  reason (`vocabulary`'s names) when its impression showed no such document
  (`not_shown`), when the impression is of another query (`query_mismatch`),
  when it arrives after the impression's clicks are final (`after_session`) or
  when its impression never arrives (`unknown_impression`, below).
- A click that arrives before its impression is held until the impression
  arrives (and then joins it, whatever the clock) or until the clock passes the
  click's own time plus `session_ms`, when it is rejected as
  `unknown_impression`. Held clicks are counted only once they are decided, each
  as if it came then (a held click delivered twice is then a duplicate, or, if
  its impression never comes, two rejections).
- A click counts once per (impression, document): the same event delivered
  again, or a second click on the same result of the same search, is a
  duplicate (`duplicate:click`). An impression id seen again while remembered
  is a duplicate impression; an impression is remembered until the clock
  passes its session's end (or its arrival, if later) plus `dedup_ms` (the
  service's `dedup_horizon`), then forgotten with its clicks: a click on it
  then waits for an impression that does not come.
- An impression whose time bucket is already behind the horizon when it
  arrives is rejected `too_old` (with the clicks held for it).

    sessions = Sessions(max_rank=20, session_ms=1_800_000, dedup_ms=3_600_000,
                        oldest_bucket=lambda clock_ms: ..., bucket_of=lambda ts: ts // 86_400_000)
    sessions.impression(impression, clock)
    sessions.click(click, clock)
    for final in sessions.final_before(boundary): ...    # FinalImpression
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stream_ndcg.events import Click, Impression
from stream_ndcg.vocabulary import (
    AFTER_SESSION,
    CLICK,
    IMPRESSION,
    NOT_SHOWN,
    QUERY_MISMATCH,
    TOO_OLD,
    UNKNOWN_IMPRESSION,
    duplicate,
    rejected,
)


class FinalImpression(NamedTuple):
    """An impression whose clicks are final: what the click models count.

    `ranks` holds (rank, document) for each distinct document at its first position, in rank
    order, those at ranks up to `max_rank` only (a later repeat of a document is no result of
    its own: no click can be on it); `clicked` the ranks among them that were clicked."""

    impression_id: str
    query_id: str
    ts: int
    ranks: tuple[tuple[int, str], ...]
    clicked: frozenset[int]


@dataclass
class _Session:
    impression: Impression
    # The clock when the impression was accepted.
    accepted_ms: int
    # Documents clicked, each once.
    clicked: set[str] = field(default_factory=set)
    final: bool = False


class Sessions:
    """The open impressions, the clicks held for impressions not yet seen, and what is remembered
    for duplicates. `counts` uses `vocabulary`'s keys: accepted impressions and clicks by type,
    duplicates by type, rejections by reason; `open` and `held` are the impressions open and the
    clicks held now."""

    def __init__(self, *, max_rank: int, session_ms: int, dedup_ms: int,
                 oldest_bucket: Callable[[int], int], bucket_of: Callable[[int], int]) -> None:
        if max_rank < 1 or session_ms < 0 or dedup_ms < 0:
            raise ValueError("max_rank must be positive, session_ms and dedup_ms not negative")
        self.max_rank = max_rank
        self.session_ms = session_ms
        self.dedup_ms = dedup_ms
        # The first time bucket kept at a clock, and an event time's bucket (`click_models`).
        self.oldest_bucket = oldest_bucket
        self.bucket_of = bucket_of
        self.counts: Counter[str] = Counter()
        self._sessions: dict[str, _Session] = {}
        # (time plus session, impression id) of the open sessions, and (when forgotten, impression
        # id) of every session: heaps, so that the clock's moves cost what they hand over.
        self._ending: list[tuple[int, str]] = []
        self._forgetting: list[tuple[int, str]] = []
        # impression id -> the clicks held for it, waiting for the impression, in the order they
        # came (all of them: each is decided when the impression comes, as if it came then), each
        # with its serial number; (end of its wait, serial, impression id) of each, a heap whose
        # entries for clicks joined meanwhile are passed over.
        self._held: dict[str, list[tuple[int, Click]]] = {}
        self._waits: list[tuple[int, int, str]] = []
        self._serial = 0
        self.held = 0
        self.open = 0
        # The impression ids whose session, or whose held clicks, changed since `take_touched`: what
        # a store writes again (`click_state`).
        self.touched: set[str] = set()
        self.touched_held: set[str] = set()

    def impression(self, event: Impression, clock_ms: int) -> None:
        """Take an impression in at `clock_ms` (the clock already moved to its time if later)."""
        if event.impression_id in self._sessions:
            self.counts[duplicate(IMPRESSION)] += 1
            return
        held = self._held.pop(event.impression_id, [])
        self.held -= len(held)
        if held:
            self.touched_held.add(event.impression_id)
        if self.bucket_of(event.ts) < self.oldest_bucket(clock_ms):
            self.counts[rejected(TOO_OLD)] += 1 + len(held)
            return
        self.counts[IMPRESSION] += 1
        session = self._sessions[event.impression_id] = _Session(event, clock_ms)
        self.touched.add(event.impression_id)
        self.open += 1
        heapq.heappush(self._ending, (event.ts + self.session_ms, event.impression_id))
        heapq.heappush(self._forgetting, (self._forget_at(session), event.impression_id))
        for _, click in held:
            self._join(click, session)

    def click(self, event: Click, clock_ms: int) -> None:
        """Take a click in at `clock_ms`: join it, hold it, or count why not."""
        session = self._sessions.get(event.impression_id)
        if session is None:
            self._serial += 1
            self._held.setdefault(event.impression_id, []).append((self._serial, event))
            self.touched_held.add(event.impression_id)
            heapq.heappush(self._waits, (event.ts + self.session_ms, self._serial, event.impression_id))
            self.held += 1
            return
        if session.final or session.impression.ts + self.session_ms < clock_ms:
            # Final (by the clock, if not yet handed over): a duplicate of a click it took, or late.
            reason = self._rejection(event, session)
            if reason is None and event.doc_id in session.clicked:
                self.counts[duplicate(CLICK)] += 1
            else:
                self.counts[rejected(reason or AFTER_SESSION)] += 1
            return
        self._join(event, session)

    def _join(self, event: Click, session: _Session) -> None:
        reason = self._rejection(event, session)
        if reason is not None:
            self.counts[rejected(reason)] += 1
        elif event.doc_id in session.clicked:
            self.counts[duplicate(CLICK)] += 1
        else:
            session.clicked.add(event.doc_id)
            self.touched.add(session.impression.impression_id)
            self.counts[CLICK] += 1

    @staticmethod
    def _rejection(event: Click, session: _Session) -> str | None:
        if event.query_id != session.impression.query_id:
            return QUERY_MISMATCH
        if event.doc_id not in session.impression.results:
            return NOT_SHOWN
        return None

    def final_before(self, clock_ms: int) -> list[FinalImpression]:
        """Hand over the impressions whose clicks are final at `clock_ms` (time plus session before
        it), in order of (time, id); forget what is no longer remembered, and reject the held
        clicks whose wait is over."""
        final = []
        while self._ending and self._ending[0][0] < clock_ms:
            _, impression_id = heapq.heappop(self._ending)
            session = self._sessions[impression_id]
            session.final = True
            self.touched.add(impression_id)
            self.open -= 1
            final.append(self._final(session))
        # Forgotten at or after its end (`_forget_at`), so a session forgotten here is final.
        while self._forgetting and self._forgetting[0][0] < clock_ms:
            forgotten = heapq.heappop(self._forgetting)[1]
            del self._sessions[forgotten]
            self.touched.add(forgotten)
        while self._waits and self._waits[0][0] < clock_ms:
            _, serial, impression_id = heapq.heappop(self._waits)
            held = self._held.get(impression_id, [])
            waiting = [(number, click) for number, click in held if number != serial]
            if len(waiting) < len(held):
                self.touched_held.add(impression_id)
                self.counts[rejected(UNKNOWN_IMPRESSION)] += 1
                self.held -= 1
                if waiting:
                    self._held[impression_id] = waiting
                else:
                    del self._held[impression_id]
        return final

    def _forget_at(self, session: _Session) -> int:
        return max(session.impression.ts + self.session_ms, session.accepted_ms) + self.dedup_ms

    def _final(self, session: _Session) -> FinalImpression:
        impression = session.impression
        first: dict[str, int] = {}
        for rank, doc in enumerate(impression.results[: self.max_rank], start=1):
            first.setdefault(doc, rank)
        ranks = tuple((rank, doc) for doc, rank in first.items())
        clicked = frozenset(rank for rank, doc in ranks if doc in session.clicked)
        return FinalImpression(impression.impression_id, impression.query_id, impression.ts, ranks, clicked)

    # -- plain data (`click_state`) -------------------------------------------

    @property
    def serial(self) -> int:
        """The serial number of the last click held."""
        return self._serial

    def session_state(self, impression_id: str) -> list[Any] | None:
        """An impression's session as plain data: [query, time, results, segment, event id, accepted
        at, documents clicked, final]; None if none is remembered."""
        session = self._sessions.get(impression_id)
        if session is None:
            return None
        impression = session.impression
        return [impression.query_id, impression.ts, list(impression.results), [list(s) for s in impression.segment],
                impression.event_id, session.accepted_ms, sorted(session.clicked), session.final]

    def held_state(self, impression_id: str) -> list[Any] | None:
        """The clicks held for an impression as plain data: [[serial, query, document, time, event id]...]."""
        held = self._held.get(impression_id)
        if not held:
            return None
        return [[serial, click.query_id, click.doc_id, click.ts, click.event_id] for serial, click in held]

    def states(self) -> tuple[dict[str, list[Any] | None], dict[str, list[Any] | None]]:
        """Every session and every impression's held clicks, as plain data."""
        return ({i: self.session_state(i) for i in self._sessions}, {i: self.held_state(i) for i in self._held})

    def restore(self, sessions: Mapping[str, list[Any] | None], held: Mapping[str, list[Any] | None],
                serial: int, counts: Mapping[str, int]) -> None:
        """Take the state `states` gave (with `serial` and `counts`) into these empty sessions. The
        heaps are built again from it: they order by (time, id) and (time, serial), so they pop as
        the saved ones would have."""
        self._serial = serial
        self.counts.update(counts)
        for impression_id, plain in sessions.items():
            if plain is None:
                continue
            query_id, ts, results, segment, event_id, accepted_ms, clicked, final = plain
            event = Impression(impression_id, query_id, ts, tuple(results), tuple((k, v) for k, v in segment),
                               event_id)
            session = self._sessions[impression_id] = _Session(event, accepted_ms, set(clicked), final)
            self._forgetting.append((self._forget_at(session), impression_id))
            if not final:
                self._ending.append((ts + self.session_ms, impression_id))
                self.open += 1
        for impression_id, clicks in held.items():
            if not clicks:
                continue
            waiting = self._held[impression_id] = []
            for number, query_id, doc_id, ts, event_id in clicks:
                waiting.append((number, Click(impression_id, query_id, doc_id, ts, event_id)))
                self._waits.append((ts + self.session_ms, number, impression_id))
                self.held += 1
        heapq.heapify(self._ending)
        heapq.heapify(self._forgetting)
        heapq.heapify(self._waits)

    def take_touched(self) -> tuple[set[str], set[str]]:
        """The impression ids whose session, and whose held clicks, changed since the last call."""
        touched, held = self.touched, self.touched_held
        self.touched, self.touched_held = set(), set()
        return touched, held
