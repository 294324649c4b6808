"""The event contract: valid events parse, and every rejection reason has its case."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stream_ndcg import decoding, events
from stream_ndcg.events import (
    DEFAULT_LIMITS,
    MAX_TS_MS,
    Click,
    Impression,
    InvalidEvent,
    Judgment,
    Limits,
    parse_event,
)
from stream_ndcg.metric import MAX_ABS_GRADE, MIN_ABS_GRADE
from tests.support.events import BAD, CLICK, IMPRESSION, JUDGMENT, encode, without


def test_the_contract_examples_parse() -> None:
    assert parse_event(encode(IMPRESSION)) == Impression(
        impression_id="imp-81", query_id="cheap flights", ts=1763683200000, results=("d17", "d4", "d99"),
        segment=(("variant", "B"),), event_id="e-1")
    assert parse_event(encode(JUDGMENT)) == Judgment(
        query_id="cheap flights", doc_id="d4", grade=2.0, ts=1763683260000, event_id="e-2")
    assert parse_event(encode(CLICK)) == Click(
        impression_id="imp-81", query_id="cheap flights", doc_id="d4", ts=1763683205000, event_id="c-1")


def test_a_click_takes_the_optional_fields_and_times_of_the_other_types() -> None:
    click = parse_event(encode(without(CLICK, "event_id") | {"ts": "2025-11-21T00:00:05Z", "rank": 2}))
    assert click == Click("imp-81", "cheap flights", "d4", 1763683205000)
    # Its fast recognition and its field-by-field checks build the same click.
    text = json.dumps(CLICK, separators=(", ", ": ")).replace('"d4"', '"d:4"')
    assert parse_event(text) == Click("imp-81", "cheap flights", "d:4", 1763683205000, "c-1")


def test_a_judgment_names_its_source_and_may_carry_evidence() -> None:
    assert parse_event(encode(JUDGMENT)) == Judgment("cheap flights", "d4", 2.0, 1763683260000, "e-2", "raters")
    assert parse_event(encode(JUDGMENT | {"source": None})) == parse_event(encode(JUDGMENT))
    from_clicks = JUDGMENT | {"source": "coec", "evidence": {"impressions": 40, "clicks": 9, "expected_clicks": 4.5}}
    assert parse_event(encode(from_clicks)) == Judgment("cheap flights", "d4", 2.0, 1763683260000, "e-2", "coec")
    # The evidence's keys count as the segment's do: the usual message is still decoded fast.
    assert decoding.plain_object(encode(from_clicks), encode(from_clicks).count(b":")) is not None
    assert isinstance(parse_event(encode(JUDGMENT | {"source": "a" + "b" * 31})), Judgment)


def test_a_segment_seen_before_is_held_to_the_limits_of_each_parse() -> None:
    """The parser remembers the segments it found valid: not across limits, nor across key orders."""
    long_value = IMPRESSION | {"segment": {"variant": "B" * 20, "region": "eu"}}
    assert parse_event(encode(long_value)).segment == (("region", "eu"), ("variant", "B" * 20))  # type: ignore[union-attr]
    assert parse_event(encode(long_value), Limits(max_id_length=19)) == InvalidEvent("invalid_segment")
    assert parse_event(encode(long_value), Limits(max_segment_keys=1)) == InvalidEvent("oversize_segment")
    reordered = IMPRESSION | {"segment": {"region": "eu", "variant": "B" * 20}}
    assert parse_event(encode(reordered)) == parse_event(encode(long_value))
    # A value of another type equal to a known string's pair is no string.
    assert parse_event(encode(IMPRESSION | {"segment": {"variant": "1"}})).segment == (("variant", "1"),)  # type: ignore[union-attr]
    assert parse_event(encode(IMPRESSION | {"segment": {"variant": 1}})) == InvalidEvent("invalid_segment")
    assert parse_event(encode(IMPRESSION | {"segment": {"variant": ["B"]}})) == InvalidEvent("invalid_segment")


def test_optional_fields_and_rfc3339_times() -> None:
    event = parse_event(encode(without(without(IMPRESSION, "segment"), "event_id") | {"ts": "2025-11-21T00:00:00Z"}))
    assert isinstance(event, Impression)
    assert event.ts == 1763683200000 and event.segment == () and event.event_id is None
    offset = parse_event(encode(JUDGMENT | {"ts": "2025-11-21T01:00:00.250+01:00", "grade": None}))
    assert isinstance(offset, Judgment) and offset.ts == 1763683200250 and offset.grade is None
    assert isinstance(parse_event(encode(IMPRESSION | {"results": []})), Impression)
    assert isinstance(parse_event(encode(JUDGMENT | {"grade": -1.5})), Judgment)
    assert isinstance(parse_event(encode(IMPRESSION | {"extra": {"ignored": True}})), Impression)


@pytest.mark.parametrize(("raw", "reason"), [(raw, reason) for _, raw, reason in BAD], ids=[n for n, _, _ in BAD])
def test_each_bad_message_is_rejected_with_its_reason(raw: bytes | None, reason: str) -> None:
    event = parse_event(raw)
    assert isinstance(event, InvalidEvent)
    assert event.reason == reason
    assert event.detail


def test_limits_are_configurable() -> None:
    assert isinstance(parse_event(encode(IMPRESSION), Limits(max_results=2)), InvalidEvent)
    assert isinstance(parse_event(encode(IMPRESSION), Limits(max_results=3)), Impression)


def test_a_paired_surrogate_escape_is_an_ordinary_character() -> None:
    event = parse_event(encode(JUDGMENT).replace(b'"d4"', b'"\\ud83d\\ude00"'))
    assert isinstance(event, Judgment) and event.doc_id == "\U0001F600"


def test_a_str_holding_a_lone_surrogate_itself_is_not_utf8() -> None:
    event = parse_event('{"type":"judgment","query_id":"q\udcff","doc_id":"d","grade":1,"ts":1}')
    assert isinstance(event, InvalidEvent) and event.reason == "not_utf8"


@given(st.binary(max_size=300))
def test_no_bytes_make_the_parser_raise(raw: bytes) -> None:
    event = parse_event(raw)
    assert isinstance(event, Impression | Judgment | Click | InvalidEvent)
    if not isinstance(event, InvalidEvent):
        json.dumps(event._asdict(), ensure_ascii=False).encode("utf-8")  # whatever is accepted can be stored


def json_scalars(*, allow_infinity: bool) -> st.SearchStrategy[object]:
    """Any scalar json.dumps writes; with infinities it writes `Infinity`, which is not JSON."""
    return (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=allow_infinity)
            | st.text(max_size=8))


def json_values(*, allow_infinity: bool) -> st.SearchStrategy[object]:
    return st.recursive(
        json_scalars(allow_infinity=allow_infinity),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=12,
    )


def faults(obj: dict[str, object]) -> set[str]:
    """Every reason `obj` deserves to be rejected for, found independently of the parser (which
    names one of them: the first it meets); empty if `obj` is a valid event."""
    if _holds_infinity(obj):
        return {"not_json"}
    kind = obj["type"]
    if kind not in ("impression", "judgment", "click"):
        return {"unknown_type"}
    found: set[str] = set()
    names = {"impression": ("impression_id", "query_id"), "judgment": ("query_id", "doc_id"),
             "click": ("impression_id", "query_id", "doc_id")}[kind]
    for name in (*names, "event_id"):
        value = obj.get(name)
        if value is None:
            if name != "event_id":
                found.add(f"missing_{name}")
        elif not isinstance(value, str):
            found.add(f"invalid_{name}")
        elif not value:
            found.add(f"empty_{name}")
        elif len(value) > DEFAULT_LIMITS.max_id_length:
            found.add(f"oversize_{name}")
    ts = obj.get("ts")
    if ts is None:
        found.add("missing_ts")
    elif isinstance(ts, bool) or not isinstance(ts, int | str):
        found.add("invalid_ts")
    elif isinstance(ts, str):
        assert len(ts) < 20, "the strings drawn here are too short to be RFC 3339 times"
        found.add("invalid_ts")
    elif not 0 <= ts <= MAX_TS_MS:
        found.add("ts_out_of_range")
    if kind == "impression":
        found |= _result_faults(obj.get("results")) | _segment_faults(obj.get("segment"))
    elif kind == "click":
        pass
    elif "grade" not in obj:
        found.add("missing_grade")
    elif (grade := obj["grade"]) is not None:
        if isinstance(grade, bool) or not isinstance(grade, int | float):
            found.add("invalid_grade")
        elif abs(grade) > MAX_ABS_GRADE or 0 < abs(grade) < MIN_ABS_GRADE:
            found.add("grade_out_of_range")
    if kind == "judgment":
        found |= _source_faults(obj.get("source")) | _evidence_faults(obj.get("evidence"))
    return found


def _source_faults(source: object) -> set[str]:
    if source is None or isinstance(source, str) and re.fullmatch(r"[a-z][-_a-z0-9]{0,31}", source):
        return set()
    return {"invalid_source"}


def _evidence_faults(evidence: object) -> set[str]:
    if evidence is None:
        return set()
    if (not isinstance(evidence, dict) or len(evidence) > DEFAULT_LIMITS.max_segment_keys
            or any(not k or len(k) > DEFAULT_LIMITS.max_id_length or isinstance(v, bool)
                   or not isinstance(v, int | float) for k, v in evidence.items())):
        return {"invalid_evidence"}
    return set()


def _holds_infinity(value: object) -> bool:
    if isinstance(value, float):
        return value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_holds_infinity(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_infinity(v) for v in value)
    return False


def _result_faults(results: object) -> set[str]:
    if results is None:
        return {"missing_results"}
    if not isinstance(results, list):
        return {"invalid_results"}
    if len(results) > DEFAULT_LIMITS.max_results:
        return {"oversize_results"}
    found = set()
    for doc in results:
        if not isinstance(doc, str):
            found.add("invalid_result")
        elif not doc:
            found.add("empty_result")
        elif len(doc) > DEFAULT_LIMITS.max_id_length:
            found.add("oversize_result")
    return found


def _segment_faults(segment: object) -> set[str]:
    if segment is None:
        return set()
    if not isinstance(segment, dict):
        return {"invalid_segment"}
    if len(segment) > DEFAULT_LIMITS.max_segment_keys:
        return {"oversize_segment"}
    if any(not isinstance(v, str) or not k or len(k) > DEFAULT_LIMITS.max_id_length
           or len(v) > DEFAULT_LIMITS.max_id_length for k, v in segment.items()):
        return {"invalid_segment"}
    return set()


WELL_FORMED: dict[str, st.SearchStrategy[object]] = {
    "impression_id": st.text(min_size=1, max_size=8),
    "query_id": st.text(min_size=1, max_size=8),
    "doc_id": st.text(min_size=1, max_size=8),
    "event_id": st.text(min_size=1, max_size=8),
    "ts": st.integers(0, MAX_TS_MS),
    "grade": st.none() | st.integers(-3, 3) | st.floats(-MAX_ABS_GRADE, MAX_ABS_GRADE),
    "results": st.lists(st.text(min_size=1, max_size=8), max_size=4),
    "segment": st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    "source": st.sampled_from(["raters", "coec", "sdbn", "x-1_b"]),
    "evidence": st.dictionaries(st.text(min_size=1, max_size=8),
                                st.integers(0, 10**6) | st.floats(0, 1e6, allow_nan=False), max_size=3),
}


def expected_event(obj: dict[str, object]) -> Impression | Judgment | Click:
    """The event a valid object describes, built without the parser."""
    fields: dict[str, Any] = obj
    if fields["type"] == "click":
        return Click(impression_id=fields["impression_id"], query_id=fields["query_id"], doc_id=fields["doc_id"],
                     ts=fields["ts"], event_id=fields.get("event_id"))
    if fields["type"] == "impression":
        segment = fields.get("segment") or {}
        return Impression(impression_id=fields["impression_id"], query_id=fields["query_id"], ts=fields["ts"],
                          results=tuple(fields["results"]), segment=tuple(sorted(segment.items())),
                          event_id=fields.get("event_id"))
    grade = fields["grade"]
    return Judgment(query_id=fields["query_id"], doc_id=fields["doc_id"], ts=fields["ts"],
                    grade=None if grade is None else float(grade), event_id=fields.get("event_id"),
                    source=fields.get("source") or "raters")


@st.composite
def event_like_objects(draw: st.DrawFn) -> dict[str, object]:
    """Objects with the fields of events, each well-formed, absent or any JSON value; mostly well-formed,
    so that valid events and objects with a single fault are drawn as well as ones wrong everywhere."""
    obj: dict[str, object] = {"type": draw(st.sampled_from(["impression", "judgment", "click", "other"]))}
    for name, well_formed in WELL_FORMED.items():
        choice = draw(st.sampled_from(["well-formed", "well-formed", "well-formed", "absent", "any"]))
        if choice != "absent":
            obj[name] = draw(well_formed if choice == "well-formed" else json_values(allow_infinity=True))
    return obj


@given(event_like_objects())
def test_no_json_object_makes_the_parser_raise(obj: dict[str, object]) -> None:
    """Whatever an object holds, the parser returns: the event it describes, or a reason it really is bad."""
    event = parse_event(json.dumps(obj).encode())
    expected = faults(obj)
    if isinstance(event, InvalidEvent):
        assert event.reason in expected, (event, expected)
    else:
        assert not expected, (event, expected)
        assert event == expected_event(obj)


@given(json_scalars(allow_infinity=False) | st.lists(json_values(allow_infinity=False), max_size=4))
def test_json_that_is_no_object_is_rejected_as_not_an_object(value: object) -> None:
    event = parse_event(json.dumps(value).encode())
    assert isinstance(event, InvalidEvent)
    assert event.reason == "not_object"


def test_a_byte_order_mark_has_its_own_reason_in_bytes_and_in_str() -> None:
    for raw in (b"\xef\xbb\xbf" + encode(JUDGMENT), "\ufeff" + encode(JUDGMENT).decode()):
        event = parse_event(raw)
        assert isinstance(event, InvalidEvent) and event.reason == "utf8_bom"
        assert "without BOM" in event.detail


def strictly(raw: bytes | str) -> Impression | Judgment | Click | InvalidEvent:
    """What the standard library's decoder alone makes of a message: the parser's other way."""
    try:
        return events._event(decoding.strict_object(raw), DEFAULT_LIMITS)
    except decoding.Invalid as invalid:
        return InvalidEvent(invalid.reason, invalid.detail)
    except RecursionError:
        return InvalidEvent("not_json", "nested too deeply")


def written_with_repeats(pairs: list[tuple[str, object]], separator: str, *, ascii_only: bool) -> str:
    """An object's text as some producer might write it: any separator, keys possibly repeated."""
    def written(value: object) -> str:
        return json.dumps(value, ensure_ascii=ascii_only)

    return "{" + ",".join(written(key) + separator + written(value) for key, value in pairs) + "}"


@st.composite
def messages_with_traps(draw: st.DrawFn) -> bytes | str:
    """Event-like messages with what the fast decoding must hand to the strict one: a repeated key
    (at the top or in the segment), a colon within a string, an extra object, an escaped surrogate."""
    obj = draw(event_like_objects())
    pairs: list[tuple[str, object]] = list(obj.items())
    trap = draw(st.sampled_from(["none", "repeat", "repeat in segment", "colon", "object", "surrogate"]))
    if trap == "repeat" and pairs:
        key, _ = draw(st.sampled_from(pairs))
        again = draw(WELL_FORMED.get(key, st.just(obj[key])) | json_values(allow_infinity=False))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, again))
    elif trap == "repeat in segment":
        value = draw(st.text(max_size=4))
        segment = written_with_repeats([("variant", value), ("variant", value + "x")], ":", ascii_only=True)
        text = written_with_repeats(pairs, ":", ascii_only=True)
        return text[:-1] + ("," if pairs else "") + '"segment":' + segment + "}"
    elif trap == "colon":
        pairs.append((draw(st.sampled_from(["note", "doc_id", "query_id"])), draw(st.text(max_size=4)) + ":"))
    elif trap == "object":
        pairs.append(("extra", draw(st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))))
    elif trap == "surrogate":
        pairs.append(("note", draw(st.sampled_from(["\ud800", "\udc00", "\ud83d\ude00"]))))
    text = written_with_repeats(pairs, draw(st.sampled_from([":", ": ", " : "])),
                                ascii_only=draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass") if draw(st.booleans()) else text


@given(messages_with_traps())
def test_the_fast_decoding_decides_as_the_strict_decoder_does(raw: bytes | str) -> None:
    assert parse_event(raw) == strictly(raw)


@given(st.binary(max_size=200))
def test_any_bytes_are_decided_as_the_strict_decoder_does(raw: bytes) -> None:
    assume(not raw.startswith(b"\xef\xbb\xbf"))  # a byte order mark is turned away before either decodes
    assert parse_event(raw) == strictly(raw)


def test_an_integer_past_64_bits_keeps_the_strict_decoders_reason() -> None:
    # orjson reads it as a float, which would be an invalid_ts.
    event = parse_event(encode({**JUDGMENT, "ts": 10**30}))
    assert isinstance(event, InvalidEvent) and event.reason == "ts_out_of_range"


def outcome(check: Any, obj: dict[str, object], limits: Limits) -> object:
    try:
        return check(obj, limits)
    except decoding.Invalid as invalid:
        return invalid.reason


tight_limits = st.builds(Limits, max_results=st.integers(0, 5), max_id_length=st.integers(0, 9),
                         max_segment_keys=st.integers(0, 3))


@given(event_like_objects(), st.sampled_from([DEFAULT_LIMITS]) | tight_limits)
def test_the_usual_event_is_recognised_as_the_field_by_field_checks_find_it(
        obj: dict[str, object], limits: Limits) -> None:
    """`_impression`, `_judgment` and `_click` accept at once only what their field-by-field checks
    accept, and build the same event; the checks alone say why anything else is rejected."""
    assert outcome(events._impression, obj, limits) == outcome(events._checked_impression, obj, limits)
    assert outcome(events._judgment, obj, limits) == outcome(events._checked_judgment, obj, limits)
    assert outcome(events._click, obj, limits) == outcome(events._checked_click, obj, limits)


@pytest.mark.parametrize("depth", [30, 40, 1000])
def test_arrays_nested_deep_are_decided_as_the_strict_decoder_does(depth: int) -> None:
    # 1000 is deeper than the standard library's decoder goes on CPython 3.11 (about 990 levels),
    # not than orjson's 1024.
    raw = encode(IMPRESSION)[:-1] + b', "extra": ' + b"[" * depth + b"]" * depth + b"}"
    assert parse_event(raw) == strictly(raw)
