"""OpenSearch UBI documents to the event contract (`stream_ndcg.ubi`): the fixtures of tests/fixtures/ubi,
valid by the UBI 1.3.0 schemas, give the same events as the same searches written in the contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from stream_ndcg.events import Click, Impression, parse_event
from stream_ndcg.ubi import UbiJoin, UbiOptions, contract_message, ubi_timestamp

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ubi"
OPTIONS = UbiOptions(excluded_clients=("*-bot", "crawler-*"))


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def schema(name: str, *, as_meant: bool = True) -> Draft202012Validator:
    """The published schema; `as_meant` reads its two "one of the defaults, or any string" choices
    (`action_name`, `object_id_type`) as anyOf: as published (oneOf), a default such as `click`
    matches both branches and so no click is valid."""
    document = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    if as_meant and name == "event.schema.json":
        thing = document["properties"]["event_attributes"]["properties"]["object"]["properties"]
        for choice in (document["properties"]["action_name"], thing["object_id_type"]):
            choice["anyOf"] = choice.pop("oneOf")
    return Draft202012Validator(document)


def without_click_ids(events: list[Impression | Click]) -> list[Any]:
    """Events as a comparable list: the contract file carries no event ids of its own."""
    return sorted((e._replace(event_id=None) for e in events), key=repr)


def run(queries: list[tuple[int, str]], events: list[tuple[int, str]], order: list[tuple[str, int]] | None = None,
        options: UbiOptions = OPTIONS) -> tuple[UbiJoin, list[Impression | Click]]:
    """The join's output for the documents, read queries first (or in `order`: (topic, index) pairs)."""
    join = UbiJoin(options)
    out: list[Impression | Click] = []
    order = order or [("q", i) for i in range(len(queries))] + [("e", i) for i in range(len(events))]
    for topic, index in order:
        offset, doc = (queries if topic == "q" else events)[index]
        out.extend(join.add_query(doc, offset) if topic == "q" else join.add_event(doc, offset))
    return join, out


def fixture_run(order: list[tuple[str, int]] | None = None) -> tuple[UbiJoin, list[Impression | Click]]:
    return run(list(enumerate(lines("queries.jsonl"))), list(enumerate(lines("events.jsonl"))), order)


def test_the_fixtures_are_valid_ubi_1_3_0_documents() -> None:
    for name, validator in (("queries.jsonl", schema("query.request.schema.json")),
                            ("events.jsonl", schema("event.schema.json"))):
        for line in lines(name):
            validator.validate(json.loads(line))
    # The validators do check: a click whose attributes lack the position the schema requires is invalid.
    assert not schema("event.schema.json").is_valid(
        {"action_name": "click", "timestamp": "2025-03-01T10:00:00Z", "event_attributes": {"object": {"object_id": 1}}})
    # The one reading of the published schema that differs from it: taken literally, no click is valid.
    literal = schema("event.schema.json", as_meant=False)
    assert not literal.is_valid({"action_name": "click", "timestamp": "2025-03-01T10:00:00Z"})
    assert literal.is_valid({"action_name": "hover", "timestamp": "2025-03-01T10:00:00Z"})


def test_the_fixtures_give_the_same_events_as_the_contract_file() -> None:
    join, out = fixture_run()
    expected = [parse_event(line) for line in lines("contract.jsonl")]
    assert without_click_ids(out) == without_click_ids(expected)  # type: ignore[arg-type]
    assert join.counts.read == {"query": 8, "event": 15}
    assert join.counts.clicks == {"joined": 5, "unjoined": 1}
    assert join.counts.impressions == 6
    assert join.counts.skipped == {"missing_query_id": 2, "other_action": 3, "missing_object": 1,
                                   "excluded_client": 2}


def test_every_order_of_the_fixtures_gives_the_same_events() -> None:
    _, first = fixture_run()
    # The last search and event, half an hour on, move the clock past every wait: they stay last, the
    # rest is within the bounds.
    queries, events = len(lines("queries.jsonl")) - 1, len(lines("events.jsonl")) - 1
    events_first = [("e", i) for i in range(events)] + [("q", i) for i in range(queries)]
    interleaved = [(topic, i) for i in range(max(queries, events)) for topic in ("e", "q")
                   if i < (queries if topic == "q" else events)]
    for order in (events_first, interleaved):
        ordered = fixture_run([*order, ("e", events), ("q", queries)])[1]
        assert sorted(ordered, key=repr) == sorted(first, key=repr)


def test_event_ids_are_derived_from_the_documents() -> None:
    _, out = fixture_run()
    _, again = fixture_run()
    assert [e.event_id for e in out] == [e.event_id for e in again]
    impression = next(e for e in out if isinstance(e, Impression))
    assert impression.event_id == f"ubi-{impression.impression_id}"
    # The same click re-serialized (keys reordered, spaced otherwise) is the same event.
    click = json.loads(lines("events.jsonl")[0])
    query = lines("queries.jsonl")[0]
    spaced = json.dumps(dict(reversed(list(click.items()))), indent=1)
    ids = {run([(0, query)], [(0, doc)])[1][-1].event_id for doc in (lines("events.jsonl")[0], spaced)}
    assert len(ids) == 1


def test_timestamps_without_an_offset_are_utc_and_integers_epoch_milliseconds() -> None:
    assert ubi_timestamp("2018-11-13T20:20:39") == ubi_timestamp("2018-11-13T20:20:39Z") == 1_542_140_439_000
    assert ubi_timestamp("2018-11-13T21:20:39+01:00") == 1_542_140_439_000
    assert ubi_timestamp(1_542_140_439_000) == 1_542_140_439_000


def query(qid: str, ts: str, hits: list[str] | None = None, **extra: Any) -> str:
    doc = {"query_id": qid, "user_query": "tv", "timestamp": ts, **extra}
    if hits is not None:
        doc["query_response_hit_ids"] = hits
    return json.dumps(doc)


def event(qid: str, ts: str, doc_id: str | int, action: str = "click", ordinal: int | None = None) -> str:
    position = {"ordinal": ordinal} if ordinal is not None else {"xy": {"x": 1, "y": 1}}
    return json.dumps({"action_name": action, "query_id": qid, "timestamp": ts,
                       "event_attributes": {"object": {"object_id": doc_id}, "position": position}})


def test_a_click_waits_for_its_search_then_is_unjoined() -> None:
    join = UbiJoin(UbiOptions(click_wait_ms=60_000))
    assert join.add_event(event("s1", "2025-03-01T10:00:00Z", "a"), 0) == []
    assert join.low_water() == (None, 0)
    # Within the wait, the search arriving joins it.
    out = join.add_query(query("s1", "2025-03-01T09:59:59Z", ["a", "b"]), 0)
    assert [type(e).__name__ for e in out] == ["Impression", "Click"]
    assert join.add_event(event("s2", "2025-03-01T10:00:10Z", "a"), 1) == []
    assert join.low_water() == (0, 1)
    join.add_event(event("s3", "2025-03-01T10:01:11Z", "a"), 2)
    # The queries topic read as far, too: given up.
    assert join.counts.clicks == {"joined": 1}
    join.add_query(query("s4", "2025-03-01T10:01:11Z", ["b"]), 1)
    assert join.counts.clicks == {"joined": 1, "unjoined": 1}
    assert join.low_water() == (0, 2)
    # Its search arriving after the wait gives the impression alone.
    assert [type(e).__name__ for e in join.add_query(query("s2", "2025-03-01T10:00:09Z", ["a"]), 2)] == ["Impression"]


def test_a_search_is_forgotten_after_its_ttl_and_later_clicks_are_too_late() -> None:
    join = UbiJoin(UbiOptions(click_wait_ms=60_000, search_ttl_ms=600_000))
    join.add_event(event("s1", "2025-03-01T10:20:00Z", "a"), 0)
    out = join.add_query(query("s1", "2025-03-01T10:00:00Z", ["a"]), 0)
    assert [type(e).__name__ for e in out] == ["Impression"]
    assert join.counts.clicks == {"too_late": 1}
    # The clock past the ttl: the search is forgotten, so the queries topic may commit past it.
    join.add_query(query("s2", "2025-03-01T10:10:01Z", ["a"]), 1)
    assert join.low_water() == (1, None)


def test_an_impression_is_assembled_from_impression_events_within_its_wait() -> None:
    join = UbiJoin(UbiOptions(impression_wait_ms=10_000))
    join.add_event(event("s1", "2025-03-01T10:00:01Z", "c", "impression", ordinal=3), 0)
    join.add_event(event("s1", "2025-03-01T10:00:02Z", 7, "impression", ordinal=1), 1)
    join.add_event(event("s1", "2025-03-01T10:00:05Z", "b", "impression"), 2)
    join.add_event(event("s1", "2025-03-01T10:00:06Z", "c"), 3)
    assert join.low_water() == (None, 0)
    assert join.add_query(query("s1", "2025-03-01T10:00:00Z"), 0) == []
    assert join.add_event(event("other", "2025-03-01T10:00:10Z", "x", "view"), 4) == []
    assert join.low_water() == (0, 0)
    # Stamped past the wait: left out; and both topics past it complete the impression.
    assert join.add_event(event("s1", "2025-03-01T10:00:12Z", "z", "impression", ordinal=2), 5) == []
    out = join.add_query(query("s2", "2025-03-01T10:00:12Z", ["q"]), 1)[1:]
    assert out == [Impression("s1", "tv", 1_740_823_200_000, ("7", "c", "b"), (), "ubi-s1"),
                   Click("s1", "tv", "c", 1_740_823_206_000, out[1].event_id)]
    assert join.counts.skipped == {"late_impression": 1, "other_action": 1}
    assert join.low_water() == (0, None)
    # Once assembled, another impression event of it is late.
    join.add_event(event("s1", "2025-03-01T10:00:03Z", "d", "impression", ordinal=4), 6)
    assert join.counts.skipped["late_impression"] == 2


def test_a_search_without_hits_or_impression_events_gives_nothing() -> None:
    join = UbiJoin(UbiOptions(impression_wait_ms=1_000))
    join.add_query(query("s1", "2025-03-01T10:00:00Z"), 0)
    join.add_event(event("s1", "2025-03-01T10:00:01Z", "a"), 0)
    assert join.add_event(event("s1", "2025-03-01T10:00:02Z", "b", "purchase"), 1) == []
    assert join.add_query(query("s2", "2025-03-01T10:00:02Z", ["b"]), 1) != []
    assert join.counts.skipped == {"no_results": 2, "other_action": 1}


def test_excluded_clients_are_matched_as_globs_on_searches_and_events() -> None:
    join = UbiJoin(OPTIONS)
    assert join.add_query(query("s1", "2025-03-01T10:00:00Z", ["a"], client_id="quepid-nightly-bot"), 0) == []
    assert join.add_event(event("s1", "2025-03-01T10:00:01Z", "a"), 0) == []
    crawler = json.loads(event("s2", "2025-03-01T10:00:01Z", "a"))
    assert join.add_event(json.dumps({**crawler, "client_id": "crawler-7"}), 1) == []
    assert join.add_query(query("s3", "2025-03-01T10:00:00Z", ["a"], client_id="a-robot"), 1) != []
    assert join.counts.skipped == {"excluded_client": 3}


@pytest.mark.parametrize(("doc", "reason"), [
    (b"{", "not_json"), (b"[1]", "not_object"), (None, "not_json"),
    (b'{"query_id": "q", "user_query": "tv"}', "missing_timestamp"),
    (b'{"query_id": "q", "user_query": "tv", "timestamp": "yesterday"}', "invalid_timestamp"),
    (b'{"query_id": "q", "user_query": "", "timestamp": 1}', "invalid_user_query"),
    (b'{"query_id": "q", "timestamp": 1}', "missing_user_query"),
    (b'{"query_id": "q", "user_query": "tv", "timestamp": 1, "query_response_hit_ids": [1]}', "invalid_hit_ids"),
])
def test_a_query_the_contract_cannot_take_is_skipped_with_its_reason(doc: bytes | None, reason: str) -> None:
    join = UbiJoin(OPTIONS)
    assert join.add_query(doc, 0) == []
    assert join.counts.skipped == {reason: 1}


def test_the_contract_message_is_keyed_by_the_query_text_and_parses_back() -> None:
    _, out = fixture_run()
    for produced in out:
        key, value = contract_message(produced)
        assert key == produced.query_id.encode()
        assert parse_event(value) == produced


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """Searches with hits or impression events, and clicks (some on unknown searches), all within a minute:
    inside every bound, so that no order of arrival may change the output."""
    queries: list[str] = []
    events: list[str] = []
    for n in range(draw(st.integers(1, 6))):
        qid, second = f"s{n}", draw(st.integers(0, 50))
        docs = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=4, unique=True))
        assembled = draw(st.booleans())
        if draw(st.booleans()):
            queries.append(query(qid, f"2025-03-01T10:00:{second:02d}Z", None if assembled else docs))
        for rank, doc in enumerate(docs):
            if assembled:
                events.append(event(qid, f"2025-03-01T10:00:{second:02d}Z", doc, "impression", ordinal=rank))
            if draw(st.booleans()):
                events.append(event(qid, f"2025-03-01T10:00:{draw(st.integers(second, 59)):02d}Z", doc))
    return queries, events


def drain(join: UbiJoin, offset: int) -> list[Impression | Click]:
    """What a join still holds within its bounds, released by documents of both topics far enough ahead."""
    return [*join.add_event(event("end", "2025-03-01T10:05:00Z", "x", "view"), offset),
            *join.add_query(query("end", "2025-03-01T10:05:00Z", []), offset)]


@settings(max_examples=150, deadline=None)
@given(sessions(), st.randoms(use_true_random=False))
def test_no_order_of_arrival_changes_the_output_and_redelivery_repeats_its_ids(
        streams: tuple[list[str], list[str]], rng: Any) -> None:
    queries, events = streams
    order = [("q", i) for i in range(len(queries))] + [("e", i) for i in range(len(events))]
    options = UbiOptions(click_wait_ms=120_000, impression_wait_ms=60_000)
    join, first = run(list(enumerate(queries)), list(enumerate(events)), options=options)
    first += drain(join, len(events))
    rng.shuffle(order)
    join, shuffled = run(list(enumerate(queries)), list(enumerate(events)), order, options)
    shuffled += drain(join, len(events))
    assert sorted(shuffled, key=repr) == sorted(first, key=repr)
    # Every document read twice (a redelivery): only the same events again, with the same ids.
    join, twice = run(list(enumerate(queries)), list(enumerate(events)), order + order, options)
    twice += drain(join, len(events))
    assert set(twice) == set(first)
