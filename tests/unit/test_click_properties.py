"""Properties of the click models, checked by hypothesis against a from-scratch oracle.

- at every boundary the grades and evidence equal those computed from scratch over the
  impressions of the horizon whose sessions ended, with their clicks: forgetting is exact;
- any order of the events within each judge interval gives the same judgments, when the rules
  leave no room for the order to matter (clicks on searches of the interval or the one before,
  sessions of two intervals): a click held for its impression counts as one that came after it;
- delivering events again, or a second click on the same result of a search, changes no judgment.

The oracle counts per impression, literally: CTR(r) over the horizon's searches, a pair's
expected clicks as the sum over its impressions of CTR at its rank there.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.click_judge import ClickJudge, ClickJudgment, JudgeSettings
from stream_ndcg.click_models import DEFAULT_THRESHOLDS, Grading
from stream_ndcg.events import Click, Impression

T0 = 1_763_683_200_000
MINUTE = 60_000
INTERVAL = 10 * MINUTE
SESSION = 2 * INTERVAL
BUCKET = 10 * MINUTE
HORIZON = 30 * MINUTE
MAX_RANK = 3
QUERIES = ("q0", "q1")
DOCS = ("d0", "d1", "d2", "d3", "d4")

Event = Impression | Click


@st.composite
def blocks(draw: st.DrawFn) -> list[list[Event]]:
    """Each judge interval's events, in some order: searches, clicks on the searches of the same
    interval or the one before (some on documents not shown, some of another query), and clicks on
    searches that never come."""
    result: list[list[Event]] = []
    previous: list[Impression] = []
    serial = 0
    for block in range(draw(st.integers(1, 7))):
        start = T0 + block * INTERVAL
        offsets = st.integers(0, INTERVAL - 1)
        impressions = []
        for _ in range(draw(st.integers(0, 4))):
            impressions.append(Impression(f"i{serial}", draw(st.sampled_from(QUERIES)), start + draw(offsets),
                                          tuple(draw(st.lists(st.sampled_from(DOCS), max_size=5)))))
            serial += 1
        events: list[Event] = list(impressions)
        for _ in range(draw(st.integers(0, 8))):
            target = draw(st.sampled_from([*impressions, *previous])) if impressions or previous else None
            if target is None or draw(st.integers(0, 9)) == 0:
                events.append(Click(f"ghost{block}-{draw(st.integers(0, 2))}", "q0", draw(st.sampled_from(DOCS)),
                                    start + draw(offsets)))
                continue
            shown = draw(st.booleans()) and target.results
            doc = draw(st.sampled_from(target.results)) if shown else draw(st.sampled_from(DOCS))
            query = target.query_id if draw(st.integers(0, 9)) else "q1" if target.query_id == "q0" else "q0"
            events.append(Click(target.impression_id, query, doc, start + draw(offsets), f"c{draw(st.integers(0, 3))}"))
        result.append(draw(st.permutations(events)))
        previous = impressions
    # A search far ahead, so that the last sessions end and the boundaries after them are decided.
    result.append([Impression("last", "q9", T0 + (len(result) + 3) * INTERVAL, ("x",))])
    return result


gradings = st.builds(Grading, model=st.sampled_from(["coec", "sdbn"]), min_impressions=st.integers(1, 3),
                     grade=st.sampled_from(["thresholds", "score"]))


def judged(grading: Grading, events: list[Event]) -> tuple[list[ClickJudgment], Counter[str]]:
    judge = ClickJudge(JudgeSettings(grading, horizon_ms=HORIZON, bucket_ms=BUCKET, max_rank=MAX_RANK,
                                     session_ms=SESSION, interval_ms=INTERVAL, dedup_ms=INTERVAL))
    return [j for event in events for j in judge.add(event)], judge.sessions.counts


def oracle(grading: Grading, events: list[Event], boundary: int) -> dict[tuple[str, str], tuple[float, dict[str, Any]]]:
    """The grades and evidence at `boundary`, from scratch: the searches whose session ended before it
    and whose bucket the horizon keeps, each with its clicks on documents it showed."""
    first: dict[str, Impression] = {}
    for event in events:
        if isinstance(event, Impression):
            first.setdefault(event.impression_id, event)
    clicks = {(e.impression_id, e.doc_id) for e in events if isinstance(e, Click) and e.impression_id in first
              and e.query_id == first[e.impression_id].query_id and e.doc_id in first[e.impression_id].results}
    oldest = (boundary - HORIZON) // BUCKET
    kept = [i for i in first.values() if i.ts + SESSION < boundary and i.ts // BUCKET >= oldest]
    ranked = []
    for impression in kept:
        ranks: dict[str, int] = {}
        for rank, doc in enumerate(impression.results[:MAX_RANK], start=1):
            ranks.setdefault(doc, rank)
        ranked.append((impression, ranks, {ranks[d] for d in ranks if (impression.impression_id, d) in clicks}))
    shown: Counter[int] = Counter(r for _, ranks, _ in ranked for r in ranks.values())
    clicked: Counter[int] = Counter(r for _, _, ranks in ranked for r in ranks)
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for impression, ranks, hits in ranked:
        last = max(hits) if hits else MAX_RANK
        for doc, rank in ranks.items():
            counts = pairs.setdefault((impression.query_id, doc), Counter())
            counts["impressions"] += 1
            counts["expected"] += Fraction(clicked[rank], shown[rank])
            counts["clicks"] += rank in hits
            counts["examinations"] += rank <= last
            counts["last_clicks"] += rank in hits and rank == last
    graded = {}
    for pair, n in pairs.items():
        if n["impressions"] < grading.min_impressions:
            continue
        if grading.model == "coec":
            score = Fraction(n["clicks"]) / n["expected"] if n["clicks"] else Fraction(0)
            evidence = {"impressions": n["impressions"], "clicks": n["clicks"], "expected_clicks": float(n["expected"])}
        else:
            score = Fraction(n["clicks"] + 1, n["examinations"] + 2) * Fraction(n["last_clicks"] + 1, n["clicks"] + 2)
            evidence = {k: n[k] for k in ("impressions", "examinations", "clicks", "last_clicks")}
        if grading.grade == "score":
            grade = round(float(score), 3)
        else:
            t1, t2, t3 = map(Fraction, DEFAULT_THRESHOLDS[grading.model])
            grade = 0.0 if score < t1 else 1.0 if score < t2 else 2.0 if score < t3 else 3.0
        graded[pair] = (grade, evidence)
    return graded


@given(blocks(), gradings)
def test_at_every_boundary_the_grades_are_those_computed_from_scratch(
        stream: list[list[Event]], grading: Grading) -> None:
    events = [event for block in stream for event in block]
    emitted, _ = judged(grading, events)
    current: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
    last_boundary = events[-1].ts // INTERVAL * INTERVAL
    for boundary in range(T0 + INTERVAL, last_boundary + 1, INTERVAL):
        for judgment in (j for j in emitted if j.ts == boundary):
            assert judgment.event_id == f"{grading.model}@{boundary}"
            if judgment.grade is None:
                del current[(judgment.query_id, judgment.doc_id)]
            else:
                current[(judgment.query_id, judgment.doc_id)] = (judgment.grade, dict(judgment.evidence))
        # Only events before the boundary count: the ones at or after it arrive after it is decided.
        expected = oracle(grading, [e for e in events if e.ts < boundary], boundary)
        assert {pair: grade for pair, (grade, _) in current.items()} == {
            pair: grade for pair, (grade, _) in expected.items()}, boundary
        for judgment in (j for j in emitted if j.ts == boundary and j.grade is not None):
            assert dict(judgment.evidence) == expected[(judgment.query_id, judgment.doc_id)][1]


@given(blocks(), gradings, st.randoms(use_true_random=False))
def test_any_order_within_each_interval_gives_the_same_judgments(
        stream: list[list[Event]], grading: Grading, rnd: Any) -> None:
    shuffled = []
    for block in stream:
        block = list(block)
        rnd.shuffle(block)
        shuffled.append(block)
    ours, counts = judged(grading, [e for block in stream for e in block])
    theirs, shuffled_counts = judged(grading, [e for block in shuffled for e in block])
    assert ours == theirs
    assert counts == shuffled_counts


@given(blocks(), gradings, st.data())
def test_events_delivered_again_change_no_judgment(
        stream: list[list[Event]], grading: Grading, data: st.DataObject) -> None:
    again = [list(block) for block in stream]
    for index, block in enumerate(stream[:-1]):
        for event in data.draw(st.lists(st.sampled_from(block), max_size=4)) if block else []:
            # Again later in its own interval, or in the next one.
            target = data.draw(st.sampled_from([index, index + 1]))
            position = again[target].index(event) + 1 if target == index else 0
            again[target].insert(data.draw(st.integers(position, len(again[target]))), event)
            if isinstance(event, Click) and data.draw(st.booleans()):
                # A second click on the same result of the same search, with an id of its own.
                again[target].append(event._replace(event_id="another", ts=event.ts))
    ours, counts = judged(grading, [e for block in stream for e in block])
    theirs, redelivered = judged(grading, [e for block in again for e in block])
    assert ours == theirs
    assert (counts["impression"], counts["click"]) == (redelivered["impression"], redelivered["click"])
