"""The event contract, version 1: frozen events and the parser that guards them.

Each Kafka message value, and each line of a replay file, is one UTF-8 JSON
object of one of three types::

    {"type": "impression", "impression_id": "imp-81", "query_id": "cheap flights",
     "ts": 1763683200000, "results": ["d17", "d4"], "segment": {"variant": "B"},
     "event_id": "e-1"}
    {"type": "judgment", "query_id": "cheap flights", "doc_id": "d4", "grade": 2,
     "ts": 1763683260000, "event_id": "e-2", "source": "raters"}
    {"type": "click", "impression_id": "imp-81", "query_id": "cheap flights",
     "doc_id": "d4", "ts": 1763683205000, "event_id": "c-1"}

A judgment's optional `source` says who graded it (`vocabulary.RATERS` when absent or null;
a name is `vocabulary.SOURCE_RULE`), and its optional `evidence` (an object of at most
`max_segment_keys` numbers, as the click judge writes) is checked and then dropped: no grade
depends on it. A click is checked here as strictly as the other types, field by field; whether
its impression exists and showed the document is the click models' question
(`click_sessions`), not the parser's, and `run` counts clicks without applying them.

`parse_event` never raises for bad input: it returns an `InvalidEvent` whose
`reason` is a short, bounded code (a Prometheus label value) and whose
`detail` says what was wrong in words. Fields the contract does not name are
ignored, so producers can add fields without breaking the service.

The events are named tuples rather than frozen dataclasses: one is built in a
third of the time, and is one object to collect rather than two (no __dict__).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from stream_ndcg.decoding import PLAIN_BRACKETS, Invalid, plain_object, strict_object
from stream_ndcg.metric import MAX_ABS_GRADE, MIN_ABS_GRADE
from stream_ndcg.vocabulary import RATERS, SOURCE_NAME, SOURCE_RULE

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
# Timestamps past 9999-12-31 cannot be written as RFC 3339 and are not event times.
MAX_TS_MS = 253_402_300_799_999


@dataclass(frozen=True)
class Limits:
    """Bounds on one event, so that one message can never cost unbounded memory."""

    max_results: int = 1000
    max_message_bytes: int = 1_048_576
    max_id_length: int = 512
    max_segment_keys: int = 16


DEFAULT_LIMITS = Limits()


class Impression(NamedTuple):
    """One ranked list served for a query."""

    impression_id: str
    query_id: str
    ts: int
    results: tuple[str, ...]
    segment: tuple[tuple[str, str], ...] = ()
    event_id: str | None = None


class Judgment(NamedTuple):
    """A grade for a (query, document) pair from one source; grade None retracts that source's."""

    query_id: str
    doc_id: str
    grade: float | None
    ts: int
    event_id: str | None = None
    source: str = RATERS

    @property
    def precedence(self) -> tuple[int, bool, str, bool, float]:
        return revision_precedence(self.ts, self.event_id, self.grade)


def revision_precedence(ts: int, event_id: str | None, grade: float | None) -> tuple[int, bool, str, bool, float]:
    """Sort key of a judgment's revisions: the greatest wins, whatever the arrival order.

    (ts, event_id) decides, events without an event_id first at equal ts; a
    remaining tie goes to the greater grade, a retraction lowest, so that even
    two different events with the same ts and id resolve the same way in every
    order.
    """
    return (ts, event_id is not None, event_id or "", grade is not None, grade if grade is not None else 0.0)


class Click(NamedTuple):
    """A click on a document of an impression (its rank is where that impression showed it)."""

    impression_id: str
    query_id: str
    doc_id: str
    ts: int
    event_id: str | None = None


Event = Impression | Judgment | Click


@dataclass(frozen=True)
class InvalidEvent:
    """A message that broke the contract: never applied, always counted."""

    reason: str
    detail: str = field(default="", compare=False)


def parse_event(raw: bytes | str | None, limits: Limits = DEFAULT_LIMITS) -> Event | InvalidEvent:
    """Parse one message value into an event, or say why it is rejected."""
    try:
        return _parse(raw, limits)
    except Invalid as invalid:
        return InvalidEvent(invalid.reason, invalid.detail)
    except RecursionError:
        return InvalidEvent("not_json", "nested too deeply")


def _parse(raw: bytes | str | None, limits: Limits) -> Event:
    if isinstance(raw, bytes):
        size, bom = len(raw), raw.startswith(b"\xef\xbb\xbf")
        colons, brackets = raw.count(b":"), raw.count(b"[")
    elif raw is None:
        raise Invalid("null_message", "message has no value (tombstone)")
    else:
        size, bom = len(raw.encode("utf-8", "surrogatepass")), raw.startswith("\ufeff")
        colons, brackets = raw.count(":"), raw.count("[")
    if size > limits.max_message_bytes:
        raise Invalid("message_too_large", f"{size} bytes > {limits.max_message_bytes}")
    if bom:
        # JSON forbids a byte order mark; Windows editors and PowerShell write one at a file's start.
        raise Invalid("utf8_bom", "starts with a UTF-8 byte order mark (BOM): save the file as UTF-8 without BOM")
    obj = plain_object(raw, colons) if brackets <= PLAIN_BRACKETS else None
    if obj is not None:
        try:
            return _event(obj, limits)
        except Invalid:
            # Decided by the strict decoder: orjson reads an integer past 64 bits as a float, so a
            # rejection's reason could differ.
            pass
    return _event(strict_object(raw), limits)


def _event(obj: dict[str, Any], limits: Limits) -> Event:
    kind = obj.get("type")
    if kind is None:
        raise Invalid("missing_type", "no 'type' field")
    if kind == "impression":
        return _impression(obj, limits)
    if kind == "judgment":
        return _judgment(obj, limits)
    if kind == "click":
        return _click(obj, limits)
    raise Invalid("unknown_type", f"type {str(kind)[:64]!r} is not impression, judgment or click")


def _identifier(obj: dict[str, Any], name: str, limits: Limits, *, optional: bool = False) -> Any:
    value = obj.get(name)
    if value is None:
        if optional:
            return None
        raise Invalid(f"missing_{name}", f"no '{name}' field")
    if not isinstance(value, str):
        raise Invalid(f"invalid_{name}", f"'{name}' must be a string, got {type(value).__name__}")
    if not value:
        raise Invalid(f"empty_{name}", f"'{name}' is empty")
    if len(value) > limits.max_id_length:
        raise Invalid(f"oversize_{name}", f"'{name}' is {len(value)} characters > {limits.max_id_length}")
    return value


def _timestamp(obj: dict[str, Any]) -> int:
    value = obj.get("ts")
    if value is None:
        raise Invalid("missing_ts", "no 'ts' field")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise Invalid("invalid_ts", f"'ts' must be epoch milliseconds or RFC 3339, got {type(value).__name__}")
    if isinstance(value, str):
        value = _rfc3339_ms(value)
    if value < 0:
        raise Invalid("ts_out_of_range", f"ts {value} is before 1970")
    if value > MAX_TS_MS:
        raise Invalid("ts_out_of_range", f"ts {value} is after 9999")
    return value


def _rfc3339_ms(text: str) -> int:
    # fromisoformat accepts more than RFC 3339 (week dates, no 'T'...); insist on its core shape.
    if len(text) < 20 or text[4] != "-" or text[7] != "-" or text[10] not in "Tt ":
        raise Invalid("invalid_ts", f"ts {text[:64]!r} is not RFC 3339")
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise Invalid("invalid_ts", f"ts {text[:64]!r} is not RFC 3339") from None
    if moment.tzinfo is None:
        raise Invalid("invalid_ts", f"ts {text[:64]!r} has no UTC offset")
    return (moment - _EPOCH) // _MILLISECOND


def _impression(obj: dict[str, Any], limits: Limits) -> Impression:
    """The impression `obj` describes. The usual one is recognised in one expression of the same
    checks; anything else is checked field by field, which finds the reason to reject it."""
    impression_id = obj.get("impression_id")
    query_id = obj.get("query_id")
    event_id = obj.get("event_id")
    ts = obj.get("ts")
    results = obj.get("results")
    segment = obj.get("segment")
    longest = limits.max_id_length
    if (type(impression_id) is str and 0 < len(impression_id) <= longest
            and type(query_id) is str and 0 < len(query_id) <= longest
            and (event_id is None or type(event_id) is str and 0 < len(event_id) <= longest)
            and type(ts) is int and 0 <= ts <= MAX_TS_MS
            and type(results) is list and len(results) <= limits.max_results and _short_ids(results, longest)
            and (pairs := _usual_segment(segment, limits)) is not None):
        return Impression(impression_id, query_id, ts, tuple(results), pairs, event_id)
    return _checked_impression(obj, limits)


# Segments found valid, as messages give them (pairs in their order), with the event's sorted pairs and their longest
# string: a stream repeats a few, and checking and sorting each again was a good part of an impression's parse.
_KNOWN_SEGMENTS: dict[tuple[tuple[str, Any], ...], tuple[tuple[tuple[str, str], ...], int]] = {}
KNOWN_SEGMENTS = 10_000


def _usual_segment(segment: Any, limits: Limits) -> tuple[tuple[str, str], ...] | None:
    """The event's pairs of a valid `segment` (absent: none); None if it is not valid."""
    if segment is None:
        return ()
    if type(segment) is not dict or len(segment) > limits.max_segment_keys:
        return None
    given = tuple(segment.items())
    try:
        known = _KNOWN_SEGMENTS.get(given)
    except TypeError:
        # A value that is a list or an object cannot be hashed, nor is it a segment's string.
        return None
    if known is None:
        if not all(type(value) is str and key for key, value in given):
            return None
        if len(_KNOWN_SEGMENTS) >= KNOWN_SEGMENTS:
            _KNOWN_SEGMENTS.clear()
        longest = max((len(text) for pair in given for text in pair), default=0)
        known = _KNOWN_SEGMENTS[given] = (tuple(sorted(given)), longest)
    pairs, longest = known
    return pairs if longest <= limits.max_id_length else None


def _short_ids(values: list[Any], longest: int) -> bool:
    """Whether every value is a non-empty string of at most `longest` characters, found by the
    interpreter's own loops (join refuses anything but strings)."""
    try:
        joined = "".join(values)
    except TypeError:
        return False
    return "" not in values and (len(joined) <= longest or max(map(len, values)) <= longest)


def _checked_impression(obj: dict[str, Any], limits: Limits) -> Impression:
    impression_id = _identifier(obj, "impression_id", limits)
    query_id = _identifier(obj, "query_id", limits)
    event_id = _identifier(obj, "event_id", limits, optional=True)
    ts = _timestamp(obj)
    results = obj.get("results")
    if results is None:
        raise Invalid("missing_results", "no 'results' field")
    if not isinstance(results, list):
        raise Invalid("invalid_results", f"'results' must be a list, got {type(results).__name__}")
    if len(results) > limits.max_results:
        raise Invalid("oversize_results", f"{len(results)} results > {limits.max_results}")
    for doc in results:
        if not isinstance(doc, str):
            raise Invalid("invalid_result", f"a result must be a document id string, got {type(doc).__name__}")
        if not doc:
            raise Invalid("empty_result", "a result is an empty document id")
        if len(doc) > limits.max_id_length:
            raise Invalid("oversize_result", f"a document id is {len(doc)} characters > {limits.max_id_length}")
    return Impression(
        impression_id=impression_id,
        query_id=query_id,
        ts=ts,
        results=tuple(results),
        segment=_segment(obj.get("segment"), limits),
        event_id=event_id,
    )


def _segment(value: Any, limits: Limits) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise Invalid("invalid_segment", f"'segment' must be an object, got {type(value).__name__}")
    if len(value) > limits.max_segment_keys:
        raise Invalid("oversize_segment", f"{len(value)} segment keys > {limits.max_segment_keys}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise Invalid("invalid_segment", f"segment value of {key[:64]!r} must be a string")
        if not key or len(key) > limits.max_id_length or len(item) > limits.max_id_length:
            raise Invalid("invalid_segment", "segment keys must be non-empty and segment strings short")
    return tuple(sorted(value.items()))


def _judgment(obj: dict[str, Any], limits: Limits) -> Judgment:
    """The judgment `obj` describes: the usual one recognised at once, as in `_impression`."""
    query_id = obj.get("query_id")
    doc_id = obj.get("doc_id")
    event_id = obj.get("event_id")
    ts = obj.get("ts")
    grade = obj.get("grade")
    source = obj.get("source")
    evidence = obj.get("evidence")
    longest = limits.max_id_length
    if (type(query_id) is str and 0 < len(query_id) <= longest
            and type(doc_id) is str and 0 < len(doc_id) <= longest
            and (event_id is None or type(event_id) is str and 0 < len(event_id) <= longest)
            and type(ts) is int and 0 <= ts <= MAX_TS_MS
            and (type(grade) is float or type(grade) is int)
            and (grade == 0 or MIN_ABS_GRADE <= abs(grade) <= MAX_ABS_GRADE)
            and (source is None or type(source) is str and SOURCE_NAME.fullmatch(source) is not None)
            and evidence is None):
        return Judgment(query_id, doc_id, float(grade), ts, event_id, source or RATERS)
    return _checked_judgment(obj, limits)


def _checked_judgment(obj: dict[str, Any], limits: Limits) -> Judgment:
    query_id = _identifier(obj, "query_id", limits)
    doc_id = _identifier(obj, "doc_id", limits)
    event_id = _identifier(obj, "event_id", limits, optional=True)
    ts = _timestamp(obj)
    if "grade" not in obj:
        raise Invalid("missing_grade", "no 'grade' field (null retracts; absent is an error)")
    grade = obj["grade"]
    if grade is not None:
        if isinstance(grade, bool) or not isinstance(grade, (int, float)):
            raise Invalid("invalid_grade", f"'grade' must be a number or null, got {type(grade).__name__}")
        grade = float(grade) if abs(grade) <= MAX_ABS_GRADE else math.inf
        if not math.isfinite(grade):
            raise Invalid("grade_out_of_range", f"|grade| must be at most {MAX_ABS_GRADE:g}")
        if 0.0 < abs(grade) < MIN_ABS_GRADE:
            raise Invalid("grade_out_of_range", f"|grade| must be 0 or at least {MIN_ABS_GRADE:g}")
    source = _source(obj.get("source"))
    _check_evidence(obj.get("evidence"), limits)
    return Judgment(query_id=query_id, doc_id=doc_id, grade=grade, ts=ts, event_id=event_id, source=source)


def _source(value: Any) -> str:
    if value is None:
        return RATERS
    if not isinstance(value, str):
        raise Invalid("invalid_source", f"'source' must be a string, got {type(value).__name__}")
    if SOURCE_NAME.fullmatch(value) is None:
        raise Invalid("invalid_source", f"source {value[:64]!r} is not {SOURCE_RULE}")
    return value


def _check_evidence(value: Any, limits: Limits) -> None:
    """Evidence is for people to check a grade by: an object of numbers, bounded like a segment."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise Invalid("invalid_evidence", f"'evidence' must be an object, got {type(value).__name__}")
    if len(value) > limits.max_segment_keys:
        raise Invalid("invalid_evidence", f"{len(value)} evidence keys > {limits.max_segment_keys}")
    for key, item in value.items():
        if not key or len(key) > limits.max_id_length:
            raise Invalid("invalid_evidence", "evidence keys must be non-empty and short")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise Invalid("invalid_evidence", f"evidence value of {key[:64]!r} must be a number")


def _click(obj: dict[str, Any], limits: Limits) -> Click:
    """The click `obj` describes: the usual one recognised at once, as in `_impression`."""
    impression_id = obj.get("impression_id")
    query_id = obj.get("query_id")
    doc_id = obj.get("doc_id")
    event_id = obj.get("event_id")
    ts = obj.get("ts")
    longest = limits.max_id_length
    if (type(impression_id) is str and 0 < len(impression_id) <= longest
            and type(query_id) is str and 0 < len(query_id) <= longest
            and type(doc_id) is str and 0 < len(doc_id) <= longest
            and (event_id is None or type(event_id) is str and 0 < len(event_id) <= longest)
            and type(ts) is int and 0 <= ts <= MAX_TS_MS):
        return Click(impression_id, query_id, doc_id, ts, event_id)
    return _checked_click(obj, limits)


def _checked_click(obj: dict[str, Any], limits: Limits) -> Click:
    return Click(impression_id=_identifier(obj, "impression_id", limits), query_id=_identifier(obj, "query_id", limits),
                 doc_id=_identifier(obj, "doc_id", limits), ts=_timestamp(obj),
                 event_id=_identifier(obj, "event_id", limits, optional=True))
