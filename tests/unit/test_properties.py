"""Properties of the contract and the engine, checked by hypothesis.

- any permutation of the events gives the same replay output;
- delivering any events again gives the same output;
- the incremental engine, through the in-memory store, equals the batch
  replay after every batch, whatever the batch boundaries, and so it does with a
  dedup horizon over resent impressions;
- states kept in memory from batch to batch (as the Redis store's cache keeps
  them) write the same drill-down rows as states read back from their stored form;
- clicks in the stream are counted and change nothing else of the service's state;
- judgments of several sources, in any order and any batches, give the numbers of a batch
  recomputation that takes each document's grade from the first listed source with one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.engine import Engine
from stream_ndcg.metric import Measure, score_list
from stream_ndcg.offline.replay import Replay
from stream_ndcg.offline.totals import OVER_QUERIES, ScoreTotals
from stream_ndcg.query_state import QueryState
from stream_ndcg.rows import group_row
from stream_ndcg.state.format import state_fields, state_from_fields
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import UNLISTED_SOURCE, full_segment_key
from stream_ndcg.windows import window_means
from tests.support.batches import apply_batch, parsed

DOCS = [f"d{i}" for i in range(7)]
QUERIES = ["q0", "q1", "q2"]

grades = st.sampled_from([None, -1, 0, 1, 2, 3, 0.5])
timestamps = st.integers(min_value=0, max_value=5)
event_ids = st.sampled_from([None, "a", "b"])
# None: no source field (raters'); "ugc" is in no order drawn below.
sources = st.sampled_from([None, "raters", "coec", "sdbn", "ugc"])
orders = st.sampled_from([("raters", "coec", "sdbn"), ("coec", "raters"), ("sdbn", "coec"), ("raters",)])


@st.composite
def impression(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "impression",
        "query_id": draw(st.sampled_from(QUERIES)),
        "ts": draw(timestamps) * 60_000,
        "results": draw(st.lists(st.sampled_from(DOCS), max_size=8)),
    }
    variant = draw(st.sampled_from([None, "A", "B"]))
    if variant:
        event["segment"] = {"variant": variant}
    return event


@st.composite
def judgment(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "judgment",
        "query_id": draw(st.sampled_from(QUERIES)),
        "doc_id": draw(st.sampled_from(DOCS)),
        "grade": draw(grades),
        "ts": draw(timestamps) * 60_000,
    }
    event_id = draw(event_ids)
    if event_id:
        event["event_id"] = event_id
    source = draw(sources)
    if source:
        event["source"] = source
    return event


@st.composite
def event_streams(draw: st.DrawFn) -> list[bytes]:
    events = draw(st.lists(st.one_of(impression(), judgment()), max_size=40))
    for serial, event in enumerate(events):
        if event["type"] == "impression":
            event["impression_id"] = f"i{serial}"
    return [json.dumps(e).encode() for e in events]


measures = st.builds(
    Measure,
    cutoffs=st.sampled_from([(1, 3), (5,), (2, 10)]),
    gain=st.sampled_from(["exponential", "linear"]),
    ideal=st.sampled_from(["pool", "list"]),
    sources=orders,
)


def replayed(messages: list[bytes], measure: Measure) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    replay = Replay(measure)
    for message in messages:
        replay.add(message)
    per_impression = sorted(replay.per_impression(), key=lambda row: str(row["impression_id"]))
    return replay.summary(), per_impression


@given(event_streams(), measures, st.randoms(use_true_random=False))
def test_any_permutation_gives_the_same_replay(messages: list[bytes], measure: Measure, rnd: Any) -> None:
    shuffled = list(messages)
    rnd.shuffle(shuffled)
    assert_same(replayed(messages, measure), replayed(shuffled, measure))


@given(event_streams(), measures, st.data())
def test_delivering_events_again_changes_nothing_but_the_duplicate_count(
        messages: list[bytes], measure: Measure, data: st.DataObject) -> None:
    again = data.draw(st.lists(st.sampled_from(messages), max_size=10)) if messages else []
    positions = data.draw(st.lists(st.integers(0, len(messages)), min_size=len(again), max_size=len(again)))
    redelivered = list(messages)
    for position, message in sorted(zip(positions, again, strict=True), key=lambda p: -p[0]):
        redelivered.insert(position, message)
    original, twice = replayed(messages, measure), replayed(redelivered, measure)
    # A judgment of a source not listed is never kept, so never known again: counted as unlisted again.
    unlisted = sum(json.loads(m).get("source", "raters") not in measure.sources for m in again
                   if b'"judgment"' in m)
    assert twice[0]["events"]["duplicate"] == original[0]["events"]["duplicate"] + len(again) - unlisted
    assert twice[0]["events"][UNLISTED_SOURCE] == original[0]["events"][UNLISTED_SOURCE] + unlisted
    twice[0]["events"]["duplicate"] = original[0]["events"]["duplicate"]
    twice[0]["events"][UNLISTED_SOURCE] = original[0]["events"][UNLISTED_SOURCE]
    assert_same(original, twice)


@given(event_streams(), measures, st.lists(st.integers(1, 6), min_size=40, max_size=40))
def test_the_engine_equals_the_batch_replay_after_every_batch(
        messages: list[bytes], measure: Measure, batch_sizes: list[int]) -> None:
    # The processing clock: no expiry, so that every event counts whatever its time.
    assert_engine_equals_replay(messages, measure, batch_sizes, dedup_horizon_ms=None)


@st.composite
def resent_streams(draw: st.DrawFn) -> list[bytes]:
    """Streams in which a producer resends impressions, some soon and some long after (by event time)."""
    messages = draw(event_streams())
    for _ in range(draw(st.integers(0, 8))):
        impressions = [m for m in messages if b'"impression"' in m]
        if not impressions:
            break
        messages.insert(draw(st.integers(0, len(messages))), draw(st.sampled_from(impressions)))
    return messages


@given(resent_streams(), measures, st.lists(st.integers(1, 6), min_size=60, max_size=60),
       st.sampled_from([1_000, 60_000, 120_000, 180_000]))
def test_with_a_dedup_horizon_the_engine_equals_the_replay_after_every_batch(
        messages: list[bytes], measure: Measure, batch_sizes: list[int], dedup_horizon_ms: int) -> None:
    # The event clock moves over the stream's six minutes: a resent id behind the dedup horizon
    # is a new impression, whichever batch it falls in.
    assert_engine_equals_replay(messages, measure, batch_sizes, dedup_horizon_ms=dedup_horizon_ms)


def in_batches(messages: list[bytes], sizes: list[int]) -> Iterator[tuple[list[bytes], int]]:
    """The messages cut into batches of these sizes, each with the offset after it."""
    position = 0
    for size in sizes:
        batch = messages[position: position + size]
        if not batch:
            return
        position += len(batch)
        yield batch, position


def assert_engine_equals_replay(messages: list[bytes], measure: Measure, batch_sizes: list[int],
                                dedup_horizon_ms: int | None) -> None:
    engine = Engine(measure, dedup_horizon_ms=dedup_horizon_ms)
    store = MemoryStore(dedup_horizon_ms=dedup_horizon_ms)
    epoch = store.claim("t:0")
    replay = Replay(measure, dedup_horizon_ms=dedup_horizon_ms)
    position = 0
    for batch, position in in_batches(messages, batch_sizes):
        apply_batch(store, engine, "t:0", parsed(batch), epoch=epoch, next_offset=position,
                    event_clock=dedup_horizon_ms is not None)
        for message in batch:
            replay.add(message)
        expected = replay.summary()
        assert_close(window_means(store.aggregates(), measure.cutoffs), expected["k"])
        for value in ("A", "B"):
            key = full_segment_key((("variant", value),))
            only = {k: v for k, v in store.aggregates().items() if k[1] == key}
            expected_segment = expected["by_segment"].get("variant", {}).get(value)
            if expected_segment is not None:
                assert_close(window_means(only, measure.cutoffs), expected_segment)
        counts = store.counts()
        assert counts["impression"] == expected["events"]["impression"]
        assert counts["judgment"] == expected["events"]["judgment"]
        assert counts[UNLISTED_SOURCE] == expected["events"][UNLISTED_SOURCE]
        assert counts["duplicate:impression"] + counts["duplicate:judgment"] == expected["events"]["duplicate"]
    assert store.next_offset("t:0") == (position or None)


def assert_close(ours: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]) -> None:
    for k, row in expected.items():
        for name, value in row.items():
            if name in OVER_QUERIES:
                continue
            if name in ("scored_impressions", "impressions"):
                assert ours[k][name] == value, (k, name)
            elif value is None:
                assert ours[k][name] is None, (k, name)
            else:
                assert ours[k][name] == pytest.approx(value, abs=1e-9), (k, name)


def assert_same(a: tuple[dict[str, Any], list[dict[str, Any]]], b: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    assert a[0]["events"] == b[0]["events"]
    assert json.dumps(a[0], sort_keys=True) == json.dumps(b[0], sort_keys=True) or _close_json(a[0], b[0])
    assert len(a[1]) == len(b[1])
    for row_a, row_b in zip(a[1], b[1], strict=True):
        assert _close_json(row_a, row_b)


def _close_json(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 (fsum makes most sums exact, but a mean of a permuted list may differ in its last bit)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close_json(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9
    return bool(a == b)


@given(event_streams(), measures, st.lists(st.integers(1, 6), min_size=40, max_size=40))
def test_states_kept_from_batch_to_batch_write_the_rows_of_states_read_back(
        messages: list[bytes], measure: Measure, batch_sizes: list[int]) -> None:
    engine = Engine(measure)
    kept: dict[str, QueryState] = {}
    known: dict[str, int] = {}
    for batch, _ in in_batches(messages, batch_sizes):
        outcome = engine.apply(parsed(batch), kept, known)
        kept.update(outcome.touched)
        for (query_id, bucket, segment), row in outcome.rows.items():
            read_back = state_from_fields(state_fields(kept[query_id]))
            assert row == group_row(read_back.groups[(bucket, segment)], read_back.grades(measure.sources),
                                    measure.cutoffs)


@st.composite
def clicks(draw: st.DrawFn) -> dict[str, Any]:
    """Clicks of any impression id and time, shown or not: `run` applies none of them."""
    return {"type": "click", "impression_id": draw(st.sampled_from(["i0", "i1", "i9"])),
            "query_id": draw(st.sampled_from(QUERIES)), "doc_id": draw(st.sampled_from(DOCS)),
            # Up to ten minutes past the other events: a click that moved the event clock would expire groups.
            "ts": draw(st.integers(0, 10)) * 60_000}


@given(event_streams(), st.lists(clicks(), max_size=10), st.data(), measures,
       st.lists(st.integers(1, 6), min_size=50, max_size=50))
def test_run_counts_clicks_and_applies_none_of_them(
        messages: list[bytes], extra: list[dict[str, Any]], data: st.DataObject, measure: Measure,
        batch_sizes: list[int]) -> None:
    with_clicks = list(messages)
    for click in extra:
        with_clicks.insert(data.draw(st.integers(0, len(with_clicks))), json.dumps(click).encode())
    stores = []
    for stream in (messages, with_clicks):
        # The event clock and a horizon of two minutes: whatever moved the clock would drop groups.
        engine = Engine(measure, horizon_ms=120_000, dedup_horizon_ms=60_000)
        store = MemoryStore(horizon_ms=120_000, dedup_horizon_ms=60_000)
        epoch = store.claim("t:0")
        for batch, position in in_batches(stream, batch_sizes):
            apply_batch(store, engine, "t:0", parsed(batch), epoch=epoch, next_offset=position, event_clock=True)
        stores.append(store)
    without, clicked = stores
    assert clicked.counts() == without.counts() + Counter({"click": len(extra)})
    # Batches end elsewhere with the clicks among them, so sums may differ in their last bits.
    ours, theirs = clicked.aggregates(), without.aggregates()
    assert all(abs(ours.get(key, 0.0) - theirs.get(key, 0.0)) <= 1e-9 for key in ours.keys() | theirs.keys())
    assert clicked.clock_ms() == without.clock_ms()


def recomputed_grades(messages: list[bytes], sources: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Each query's grades from the distinct judgment events, all at once: per (document, source)
    the greatest event by (ts, event id, grade), then the first of `sources` whose event grades."""
    greatest: dict[tuple[str, str, str], tuple[tuple[Any, ...], float | None]] = {}
    for event in map(json.loads, messages):
        if event["type"] != "judgment" or event.get("source", "raters") not in sources:
            continue
        event_id, grade = event.get("event_id"), event["grade"]
        rank = (event["ts"], event_id is not None, event_id or "", grade is not None, grade or 0.0)
        key = (event["query_id"], event["doc_id"], event.get("source", "raters"))
        if key not in greatest or rank > greatest[key][0]:
            greatest[key] = (rank, None if grade is None else float(grade))
    found: dict[str, dict[str, float]] = {}
    for query_id, doc in {(q, d) for q, d, _ in greatest}:
        for source in sources:
            held = greatest.get((query_id, doc, source))
            if held is not None and held[1] is not None:
                found.setdefault(query_id, {})[doc] = held[1]
                break
    return found


@given(event_streams(), measures, st.randoms(use_true_random=False),
       st.lists(st.integers(1, 6), min_size=40, max_size=40))
def test_judgments_of_several_sources_in_any_order_give_the_batch_recomputation(
        messages: list[bytes], measure: Measure, rnd: Any, batch_sizes: list[int]) -> None:
    shuffled = list(messages)
    rnd.shuffle(shuffled)
    engine, store = Engine(measure), MemoryStore()
    epoch = store.claim("t:0")
    for batch, position in in_batches(shuffled, batch_sizes):
        apply_batch(store, engine, "t:0", parsed(batch), epoch=epoch, next_offset=position)
    grades = recomputed_grades(messages, measure.sources)
    states = store.load("t:0", QUERIES, {}).states
    assert {q: s.grades(measure.sources) for q, s in states.items() if s.grades(measure.sources)} == grades
    # Every impression scored from scratch against the recomputed grades: the batch's numbers.
    impressions = [event for event in map(json.loads, messages) if event["type"] == "impression"]
    totals = ScoreTotals(measure.cutoffs, (score_list(event["results"], grades.get(event["query_id"], {}), measure)
                                           for event in impressions))
    assert_close(window_means(store.aggregates(), measure.cutoffs), totals.means())
