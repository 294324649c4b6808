"""A traffic generator of realistic shape, for demos, tests and benchmarks.

Standard library only. Queries follow a Zipf law; each query has a corpus of
documents with a hidden true grade; each variant ranks them by that grade
plus noise (the lower the noise, the better the variant); raters judge a
share of the shown documents, and now and then an unshown one, seconds to
hours of event time later; some judgments are revised or retracted; a share
of the messages is malformed. Same seed, same events.

With `clicks`, users click too, by a position-based model: the result at rank
r is examined with probability r ** -examination_decay and, once examined,
clicked with the attractiveness of its hidden true grade; each click comes
seconds after its search, and a few are delivered twice. Clicks draw from a
random stream of their own and do not advance event time, so the other events
are the same with clicks as without.

    for key, value in Simulator(SimulationSpec(events=1000, seed=7)).messages():
        producer.send("search-events", key=key, value=value)
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

MALFORMED = (
    b"{not json",
    b'{"type": "impression"}',
    b'{"type": "judgment", "query_id": "q", "doc_id": "d", "grade": "high", "ts": 1}',
    b'{"type": "click", "query_id": "q", "ts": 1}',
    b"[1, 2, 3]",
    b"\xff\xfe",
)


@dataclass(frozen=True)
class SimulationSpec:
    """What to generate. `rate` is events (impressions and judgments) per second of event time: clicks
    come on top."""

    events: int = 10_000
    seed: int = 1
    queries: int = 1_000
    zipf_exponent: float = 1.1
    docs_per_query: int = 30
    list_length: int = 10
    # variant -> ranking noise; lower noise ranks closer to the truth.
    variants: tuple[tuple[str, float], ...] = (("A", 0.5), ("B", 2.0))
    judged_share: float = 1 / 3
    unshown_judged_share: float = 0.02
    revision_share: float = 0.05
    retraction_share: float = 0.01
    malformed_share: float = 0.0
    rate: float = 1_000.0
    start_ms: int = 1_763_683_200_000
    max_delay_ms: int = 3_600_000
    engines: tuple[str, ...] = field(default=())
    clicks: bool = False
    # P(examined) at rank r = r ** -examination_decay; P(clicked | examined) by true grade 0..3.
    examination_decay: float = 1.0
    attractiveness: tuple[float, float, float, float] = (0.05, 0.2, 0.5, 0.8)
    max_click_delay_ms: int = 60_000
    repeated_click_share: float = 0.02


class Simulator:
    """Generates the messages of one `SimulationSpec`, in arrival order.

    Event time starts at `spec.start_ms` and advances `1 / spec.rate` seconds per event; with a
    `clock` (epoch milliseconds) each event carries the clock's time when it is generated
    instead, so traffic sent as it is generated, paced or not, carries the time it is sent.
    """

    def __init__(self, spec: SimulationSpec, clock: Callable[[], int] | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self._random = random.Random(spec.seed)  # noqa: S311 - reproducible traffic, not secrets
        weights = [1.0 / (rank**spec.zipf_exponent) for rank in range(1, spec.queries + 1)]
        self._cumulative = list(itertools.accumulate(weights))
        self._truth: dict[int, list[float]] = {}
        # Clicks draw from a stream of their own, so that the other events do not change with them.
        self._click_random = random.Random(f"{spec.seed}:clicks")  # noqa: S311
        self._click_serial = itertools.count()

    def _query(self) -> int:
        point = self._random.random() * self._cumulative[-1]
        return min(bisect.bisect_left(self._cumulative, point), self.spec.queries - 1)

    def _grades(self, query: int) -> list[float]:
        grades = self._truth.get(query)
        if grades is None:
            local = random.Random(f"{self.spec.seed}:{query}")  # noqa: S311
            grades = [float(local.choices((0, 1, 2, 3), weights=(50, 25, 15, 10))[0])
                      for _ in range(self.spec.docs_per_query)]
            self._truth[query] = grades
        return grades

    def _clicks(self, impression_id: str, query_id: str, now: int, results: list[str],
                grades: list[float]) -> Iterator[tuple[int, int, bytes, bytes]]:
        """The clicks on one search, by the position-based model, each as a heap entry."""
        spec = self.spec
        rnd = self._click_random
        for rank, (doc, grade) in enumerate(zip(results, grades, strict=True), start=1):
            if rnd.random() < rank ** -spec.examination_decay * spec.attractiveness[int(grade)]:
                ts = now + rnd.randint(1_000, spec.max_click_delay_ms)
                number = next(self._click_serial)
                click = {"type": "click", "impression_id": impression_id, "query_id": query_id, "doc_id": doc,
                         "ts": ts, "event_id": f"k{spec.seed}-{number}"}
                value = json.dumps(click).encode()
                key = query_id.encode()
                yield ts, 2 * number, key, value
                if rnd.random() < spec.repeated_click_share:
                    yield ts + rnd.randint(0, 5_000), 2 * number + 1, key, value

    def messages(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs, `spec.events` of them: key the query id, value the JSON event,
        or, for a `malformed_share` of the messages, garbage."""
        share = self.spec.malformed_share
        garbage = random.Random(f"{self.spec.seed}:garbage")  # noqa: S311
        emitted = 0
        for message in self._events():
            while share and emitted < self.spec.events and garbage.random() < share:
                yield b"garbage", garbage.choice(MALFORMED)
                emitted += 1
            if emitted >= self.spec.events:
                return
            yield message
            emitted += 1

    def _events(self) -> Iterator[tuple[bytes, bytes]]:
        spec = self.spec
        rnd = self._random
        # Judgments wait in a heap until the event clock passes their time; clicks in one of their own.
        pending: list[tuple[int, int, bytes, bytes]] = []
        clicks: list[tuple[int, int, bytes, bytes]] = []
        serial = itertools.count()
        step = 1000.0 / spec.rate
        impression = 0
        events = 0
        while True:
            now = self.clock() if self.clock is not None else spec.start_ms + int(events * step)
            while pending and pending[0][0] <= now or clicks and clicks[0][0] <= now:
                if clicks and clicks[0][0] <= now and (not pending or clicks[0][0] < pending[0][0]):
                    yield heapq.heappop(clicks)[2:]
                    continue
                _, _, key, value = heapq.heappop(pending)
                yield key, value
                events += 1
            query = self._query()
            key = f"q{query}".encode()
            variant, noise = spec.variants[impression % len(spec.variants)]
            grades = self._grades(query)
            order = sorted(range(len(grades)), key=lambda d: -(grades[d] + rnd.gauss(0.0, noise)))
            shown = order[: spec.list_length]
            segment = {"variant": variant}
            if spec.engines:
                segment["engine"] = spec.engines[impression // len(spec.variants) % len(spec.engines)]
            event = {
                "type": "impression",
                "impression_id": f"i{spec.seed}-{impression}",
                "query_id": f"q{query}",
                "ts": now,
                "results": [f"d{d}" for d in shown],
                "segment": segment,
            }
            yield key, json.dumps(event).encode()
            if spec.clicks:
                for click in self._clicks(f"i{spec.seed}-{impression}", f"q{query}", now, [f"d{d}" for d in shown],
                                          [grades[d] for d in shown]):
                    heapq.heappush(clicks, click)
            impression += 1
            events += 1
            judged = [d for d in shown if rnd.random() < spec.judged_share]
            judged += [d for d in order[spec.list_length:] if rnd.random() < spec.unshown_judged_share]
            for doc in judged:
                ts = now + int(rnd.expovariate(1.0) * spec.max_delay_ms / 4) % spec.max_delay_ms + 1_000
                grade: float | None = grades[doc]
                judgment = {"type": "judgment", "query_id": f"q{query}", "doc_id": f"d{doc}", "grade": grade,
                            "ts": ts, "event_id": f"j{spec.seed}-{next(serial)}"}
                heapq.heappush(pending, (ts, next(serial), key, json.dumps(judgment).encode()))
                if rnd.random() < spec.revision_share + spec.retraction_share:
                    grade = None if rnd.random() < spec.retraction_share / (
                        spec.revision_share + spec.retraction_share) else float(rnd.randint(0, 3))
                    revised_ts = ts + rnd.randint(1_000, 600_000)
                    later = dict(judgment, grade=grade, ts=revised_ts, event_id=f"j{spec.seed}-{next(serial)}")
                    heapq.heappush(pending, (revised_ts, next(serial), key, json.dumps(later).encode()))
