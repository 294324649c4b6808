"""The click models on a small example worked out by hand, and the rules of joining clicks to impressions."""

from __future__ import annotations

from stream_ndcg.click_judge import ClickJudge, ClickJudgment, JudgeSettings
from stream_ndcg.click_models import Grading, summed
from stream_ndcg.events import Click, Impression

T0 = 1_763_683_200_000  # 2025-11-21T00:00:00Z: on a day, so on an hour
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

# One query, three documents, four searches, every result within click_max_rank = 3:
#
#   impression  results    clicked   (rank of each click)
#   i1          a b c      a         a@1
#   i2          b a c      a, c      a@2, c@3
#   i3          a c b      -
#   i4          c a b      a         a@2
#
# COEC. Each rank had a result in all 4 impressions; clicks by rank: r1 1 (i1), r2 2 (i2, i4),
# r3 1 (i2). CTR(1) = 1/4, CTR(2) = 2/4, CTR(3) = 1/4.
#   a shown at r1 (i1, i3) and r2 (i2, i4): E = 2 x 1/4 + 2 x 1/2 = 1.5; clicked 3 times: 3 / 1.5 = 2.0 -> grade 3
#   b shown at r2 (i1), r1 (i2), r3 (i3, i4): E = 1/2 + 1/4 + 2 x 1/4 = 1.25; no click: 0 -> grade 0
#   c shown at r3 (i1, i2), r2 (i3), r1 (i4): E = 2 x 1/4 + 1/2 + 1/4 = 1.25; 1 click: 0.8 -> grade 1
# (the expected clicks add up to the 4 clicks there were: 1.5 + 1.25 + 1.25). The Workbench would
# take c's best rank, 1: 1/4 x 4 impressions = 1 expected click, score 1.0, grade 2.
#
# SDBN. The last click is the deepest clicked rank; examined: every result at or above it, or all
# three without a click.
#   i1: last r1, examined a (clicked, last)       i2: last r3, examined b, a (clicked), c (clicked, last)
#   i3: no click, examined a, c, b                i4: last r2, examined c, a (clicked, last)
#   a: 4 examinations, 3 clicks, 2 last clicks: (3+1)/(4+2) x (2+1)/(3+2) = 4/6 x 3/5 = 0.4     -> grade 2
#   b: 2 examinations (i2, i3), no click:       (0+1)/(2+2) x (0+1)/(0+2) = 1/4 x 1/2 = 0.125   -> grade 1
#   c: 3 examinations (i2, i3, i4), 1 click, 1 last: (1+1)/(3+2) x (1+1)/(1+2) = 2/5 x 2/3 = 0.2667 -> grade 1
LISTS = {"i1": ("a", "b", "c"), "i2": ("b", "a", "c"), "i3": ("a", "c", "b"), "i4": ("c", "a", "b")}
CLICKS = {"i1": ("a",), "i2": ("a", "c"), "i3": (), "i4": ("a",)}


def impression(impression_id: str, ts: int, results: tuple[str, ...], query: str = "q") -> Impression:
    return Impression(impression_id, query, ts, results)


def click(impression_id: str, doc: str, ts: int, event_id: str | None = None, query: str = "q") -> Click:
    return Click(impression_id, query, doc, ts, event_id)


def example() -> list[Impression | Click]:
    """The example's events, in arrival order, with the traps the rules are about."""
    events: list[Impression | Click] = []
    for n, (impression_id, results) in enumerate(LISTS.items()):
        ts = T0 + n * MINUTE
        if impression_id == "i4":
            # Its click arrives first: held until the impression comes.
            events.append(click("i4", "a", ts + 10_000, "c-i4"))
        events.append(impression(impression_id, ts, results))
        events += [click(impression_id, doc, ts + 10_000, f"c-{impression_id}-{doc}")
                   for doc in CLICKS[impression_id] if impression_id != "i4"]
    events += [
        click("i1", "a", T0 + 20_000, "c-again"),   # a second click on the same result: a duplicate
        click("i2", "c", T0 + MINUTE + 10_000, "c-i2-c"),  # the same event delivered again
        click("i3", "z", T0 + 2 * MINUTE + 5_000),   # z was not shown
        click("i3", "a", T0 + 2 * MINUTE + 5_000, query="other"),  # another query's search
        click("i9", "a", T0 + 2 * MINUTE),            # no such impression: held, then rejected
        impression("i1", T0, ("a", "b", "c")),        # an impression delivered again
        impression("j", T0 + 40 * MINUTE, ("x",), query="r"),  # moves the clock past i1..i4's sessions
        click("i1", "b", T0 + 40 * MINUTE),           # too late: i1's clicks are final
    ]
    return events


def judge(model: str, *, min_impressions: int = 4, grade: str = "thresholds") -> ClickJudge:
    return ClickJudge(JudgeSettings(Grading(model, min_impressions, grade), max_rank=3, horizon_ms=DAY,  # type: ignore[arg-type]
                                    bucket_ms=DAY, session_ms=30 * MINUTE, interval_ms=HOUR, dedup_ms=HOUR))


def run(judge: ClickJudge, events: list[Impression | Click]) -> list[ClickJudgment]:
    return [judgment for event in events for judgment in judge.add(event)]


def by_doc(judgments: list[ClickJudgment]) -> dict[str, tuple[float | None, dict[str, int | float]]]:
    return {j.doc_id: (j.grade, dict(j.evidence)) for j in judgments if j.query_id == "q"}


def test_coec_on_the_hand_worked_example() -> None:
    coec = judge("coec")
    assert run(coec, example()) == []  # no boundary passed yet
    emitted = coec.add(impression("k", T0 + HOUR, ("x",), query="r"))
    assert by_doc(emitted) == {
        "a": (3.0, {"impressions": 4, "clicks": 3, "expected_clicks": 1.5}),
        "b": (0.0, {"impressions": 4, "clicks": 0, "expected_clicks": 1.25}),
        "c": (1.0, {"impressions": 4, "clicks": 1, "expected_clicks": 1.25}),
    }
    assert {(j.ts, j.event_id, j.source) for j in emitted} == {(T0 + HOUR, f"coec@{T0 + HOUR}", "coec")}
    assert emitted[0].message() == {"type": "judgment", "query_id": "q", "doc_id": "a", "grade": 3.0,
                                    "ts": T0 + HOUR, "event_id": f"coec@{T0 + HOUR}", "source": "coec",
                                    "evidence": {"impressions": 4, "clicks": 3, "expected_clicks": 1.5}}
    counts = coec.sessions.counts
    # i1..i4 and j (k arrived after the boundary was decided, and is counted too); the 4 clicks of the table.
    assert (counts["impression"], counts["click"]) == (6, 4)
    assert (counts["duplicate:click"], counts["duplicate:impression"]) == (2, 1)
    assert (counts["rejected:not_shown"], counts["rejected:query_mismatch"]) == (1, 1)
    assert (counts["rejected:unknown_impression"], counts["rejected:after_session"]) == (1, 1)


def test_coec_scores_as_grades() -> None:
    coec = judge("coec", grade="score")
    emitted = run(coec, [*example(), impression("k", T0 + HOUR, ("x",), query="r")])
    assert {doc: grade for doc, (grade, _) in by_doc(emitted).items()} == {"a": 2.0, "b": 0.0, "c": 0.8}


def test_sdbn_on_the_hand_worked_example() -> None:
    sdbn = judge("sdbn")
    emitted = run(sdbn, [*example(), impression("k", T0 + HOUR, ("x",), query="r")])
    assert by_doc(emitted) == {
        "a": (2.0, {"impressions": 4, "examinations": 4, "clicks": 3, "last_clicks": 2}),
        "b": (1.0, {"impressions": 4, "examinations": 2, "clicks": 0, "last_clicks": 0}),
        "c": (1.0, {"impressions": 4, "examinations": 3, "clicks": 1, "last_clicks": 1}),
    }
    scores = judge("sdbn", grade="score")
    graded = by_doc(run(scores, [*example(), impression("k", T0 + HOUR, ("x",), query="r")]))
    assert {doc: grade for doc, (grade, _) in graded.items()} == {"a": 0.4, "b": 0.125, "c": 0.267}


def test_below_the_minimum_of_impressions_nothing_is_graded_and_forgotten_pairs_are_retracted() -> None:
    assert by_doc(run(judge("coec", min_impressions=5), [*example(), impression("k", T0 + HOUR, ("x",), "r")])) == {}
    coec = judge("coec")
    run(coec, [*example(), impression("k", T0 + HOUR, ("x",), query="r")])
    # Nothing changes until the horizon (a day, in day buckets) leaves T0's day behind: at T0 + 2 days.
    assert coec.add(impression("l", T0 + 2 * DAY - 1, ("x",), query="r")) == []
    retracted = coec.add(impression("m", T0 + 2 * DAY, ("x",), query="r"))
    assert {doc: grade for doc, (grade, _) in by_doc(retracted).items()} == {"a": None, "b": None, "c": None}
    assert retracted[0].message()["grade"] is None
    assert coec.graded == {}


def test_the_rank_counts_of_partitions_add_up_to_one_streams() -> None:
    """Two partitions, each with its own queries, decide a boundary as one stream does once their
    rank counts are summed: COEC's CTR is every partition's."""
    other: list[Impression | Click] = [impression(f"o{n}", T0 + n * MINUTE, ("y", "a", "b"), query="r")
                                       for n in range(4)]
    other += [click(f"o{n}", "y", T0 + n * MINUTE + 5_000, query="r") for n in range(4)]
    trigger = impression("k", T0 + HOUR, ("x",), query="s")
    one = judge("coec")
    # r's searches first: after the example the clock is past their sessions.
    alone = run(one, [*other, *example(), trigger])
    parts = [judge("coec"), judge("coec")]
    streams: tuple[list[Impression | Click], ...] = (example(), other)
    for part, events in zip(parts, streams, strict=True):
        run(part, events)
        part.advance(T0 + HOUR - 1)
        part.close(T0 + HOUR)
    since = parts[0].oldest_bucket(T0 + HOUR)
    ctr = summed((part.stats.rank_counts(since) for part in parts), 3)
    together = [j for part in parts for j in part.emit(T0 + HOUR, ctr)]
    assert sorted(together) == sorted(alone)
    # With r's searches, every rank-1 result was clicked more often: a's expected clicks grew.
    assert by_doc(alone)["a"][1]["expected_clicks"] > 1.5


def test_only_the_first_position_of_a_document_and_ranks_up_to_the_maximum_count() -> None:
    sdbn = judge("sdbn", min_impressions=1)
    run(sdbn, [impression("i", T0, ("a", "b", "a", "c", "d")), click("i", "a", T0 + 1), click("i", "d", T0 + 2)])
    emitted = by_doc(sdbn.add(impression("k", T0 + HOUR, ("x",), query="r")))
    # Ranks 1..3 only (max_rank 3): a at 1, b at 2; the repeat of a at 3 is no result of its own, and
    # c and d are beyond. d's click is taken in but not counted, so the last click is a's, at rank 1,
    # and b was not examined.
    assert sorted(emitted) == ["a", "b"]
    assert emitted["a"][1] == {"impressions": 1, "examinations": 1, "clicks": 1, "last_clicks": 1}
    assert emitted["b"][1] == {"impressions": 1, "examinations": 0, "clicks": 0, "last_clicks": 0}


def test_a_click_waits_for_its_impression_a_session_long_and_no_longer() -> None:
    sdbn = judge("sdbn", min_impressions=1)
    run(sdbn, [click("i", "a", T0), click("j", "a", T0),
               impression("j", T0 - MINUTE, ("a",)),        # j comes in time: its click joins it
               impression("x", T0 + 31 * MINUTE, ("x",), query="r"),  # the clock passes T0 + 30 min
               impression("i", T0 - MINUTE, ("a",))])       # too late for its click
    counts = sdbn.sessions.counts
    assert (counts["click"], counts["rejected:unknown_impression"]) == (1, 1)
    emitted = by_doc(sdbn.add(impression("k", T0 + HOUR, ("x",), query="r")))
    assert emitted["a"][1] == {"impressions": 2, "examinations": 2, "clicks": 1, "last_clicks": 1}


def test_an_impression_behind_the_horizon_is_too_old_with_the_clicks_held_for_it() -> None:
    coec = judge("coec")
    run(coec, [impression("new", T0 + 2 * DAY, ("a",)), click("old", "a", T0 + 2 * DAY),
               impression("old", T0, ("a",))])
    assert coec.sessions.counts["rejected:too_old"] == 2
