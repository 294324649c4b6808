"""Sample events of the contract, and every kind of bad message with the reason it is rejected for."""

from __future__ import annotations

import json

IMPRESSION = {"type": "impression", "impression_id": "imp-81", "query_id": "cheap flights", "ts": 1763683200000,
              "results": ["d17", "d4", "d99"], "segment": {"variant": "B"}, "event_id": "e-1"}
JUDGMENT = {"type": "judgment", "query_id": "cheap flights", "doc_id": "d4", "grade": 2, "ts": 1763683260000,
            "event_id": "e-2"}
CLICK = {"type": "click", "impression_id": "imp-81", "query_id": "cheap flights", "doc_id": "d4", "ts": 1763683205000,
         "event_id": "c-1"}


def encode(obj: object) -> bytes:
    return json.dumps(obj).encode()


def without(obj: dict[str, object], name: str) -> dict[str, object]:
    return {k: v for k, v in obj.items() if k != name}


BAD: list[tuple[str, bytes | str | None, str]] = [
    ("tombstone", None, "null_message"),
    ("not utf-8", b"\xff\xfe{}", "not_utf8"),
    ("UTF-8 byte order mark", b"\xef\xbb\xbf" + encode(IMPRESSION), "utf8_bom"),
    ("not json", b"{nope", "not_json"),
    ("NaN literal", b'{"type":"judgment","query_id":"q","doc_id":"d","grade":NaN,"ts":1}', "not_json"),
    ("Infinity literal", b'{"type":"judgment","query_id":"q","doc_id":"d","grade":Infinity,"ts":1}', "not_json"),
    ("array", b"[1]", "not_object"),
    ("string", b'"impression"', "not_object"),
    ("duplicate key", b'{"type":"judgment","type":"impression"}', "duplicate_key"),
    # Either value alone makes a valid event.
    ("duplicate key, both valid", encode(JUDGMENT)[:-1] + b', "doc_id": "d5"}', "duplicate_key"),
    ("duplicate segment key", encode(IMPRESSION | {"segment": {}}).replace(b"{}", b'{"v": "A", "v": "B"}'),
     "duplicate_key"),
    ("no type", encode(without(IMPRESSION, "type")), "missing_type"),
    ("unknown type", encode(IMPRESSION | {"type": "view"}), "unknown_type"),
    ("type in capitals", encode(CLICK | {"type": "Click"}), "unknown_type"),
    ("type not a string", encode(IMPRESSION | {"type": 3}), "unknown_type"),
    ("no impression_id", encode(without(IMPRESSION, "impression_id")), "missing_impression_id"),
    ("impression_id number", encode(IMPRESSION | {"impression_id": 7}), "invalid_impression_id"),
    ("empty impression_id", encode(IMPRESSION | {"impression_id": ""}), "empty_impression_id"),
    ("oversize impression_id", encode(IMPRESSION | {"impression_id": "i" * 513}), "oversize_impression_id"),
    ("no query_id", encode(without(JUDGMENT, "query_id")), "missing_query_id"),
    ("query_id list", encode(JUDGMENT | {"query_id": ["q"]}), "invalid_query_id"),
    ("empty query_id", encode(JUDGMENT | {"query_id": ""}), "empty_query_id"),
    ("no doc_id", encode(without(JUDGMENT, "doc_id")), "missing_doc_id"),
    ("empty doc_id", encode(JUDGMENT | {"doc_id": ""}), "empty_doc_id"),
    ("event_id number", encode(JUDGMENT | {"event_id": 5}), "invalid_event_id"),
    ("empty event_id", encode(JUDGMENT | {"event_id": ""}), "empty_event_id"),
    ("click without impression_id", encode(without(CLICK, "impression_id")), "missing_impression_id"),
    ("click impression_id number", encode(CLICK | {"impression_id": 81}), "invalid_impression_id"),
    ("click without query_id", encode(without(CLICK, "query_id")), "missing_query_id"),
    ("click without doc_id", encode(without(CLICK, "doc_id")), "missing_doc_id"),
    ("click doc_id list", encode(CLICK | {"doc_id": ["d4"]}), "invalid_doc_id"),
    ("click oversize doc_id", encode(CLICK | {"doc_id": "d" * 513}), "oversize_doc_id"),
    ("click empty event_id", encode(CLICK | {"event_id": ""}), "empty_event_id"),
    ("click without ts", encode(without(CLICK, "ts")), "missing_ts"),
    ("click ts float", encode(CLICK | {"ts": 1763683205000.5}), "invalid_ts"),
    ("click ts before 1970", encode(CLICK | {"ts": -5}), "ts_out_of_range"),
    ("click lone surrogate", encode(CLICK).replace(b'"d4"', b'"\\udc00"'), "invalid_string"),
    ("no ts", encode(without(JUDGMENT, "ts")), "missing_ts"),
    ("ts float", encode(JUDGMENT | {"ts": 1.5}), "invalid_ts"),
    ("ts boolean", encode(JUDGMENT | {"ts": True}), "invalid_ts"),
    ("ts unparseable", encode(JUDGMENT | {"ts": "yesterday"}), "invalid_ts"),
    ("ts without offset", encode(JUDGMENT | {"ts": "2025-11-21T00:00:00"}), "invalid_ts"),
    ("ts before 1970", encode(JUDGMENT | {"ts": -1}), "ts_out_of_range"),
    ("ts after 9999", encode(JUDGMENT | {"ts": 10**15}), "ts_out_of_range"),
    ("no results", encode(without(IMPRESSION, "results")), "missing_results"),
    ("results object", encode(IMPRESSION | {"results": {"d1": 1}}), "invalid_results"),
    ("nested result", encode(IMPRESSION | {"results": ["d1", {"doc": "d2"}]}), "invalid_result"),
    ("empty result", encode(IMPRESSION | {"results": ["d1", ""]}), "empty_result"),
    ("oversize result", encode(IMPRESSION | {"results": ["d" * 600]}), "oversize_result"),
    ("too many results", encode(IMPRESSION | {"results": [f"d{i}" for i in range(1001)]}), "oversize_results"),
    ("source number", encode(JUDGMENT | {"source": 1}), "invalid_source"),
    ("source empty", encode(JUDGMENT | {"source": ""}), "invalid_source"),
    ("source in capitals", encode(JUDGMENT | {"source": "Raters"}), "invalid_source"),
    ("source with a space", encode(JUDGMENT | {"source": "click model"}), "invalid_source"),
    ("source oversize", encode(JUDGMENT | {"source": "s" * 33}), "invalid_source"),
    ("retraction of a bad source", encode(JUDGMENT | {"grade": None, "source": "coec|x"}), "invalid_source"),
    ("evidence list", encode(JUDGMENT | {"evidence": [1, 2]}), "invalid_evidence"),
    ("evidence text value", encode(JUDGMENT | {"evidence": {"clicks": "9"}}), "invalid_evidence"),
    ("evidence boolean value", encode(JUDGMENT | {"evidence": {"clicks": True}}), "invalid_evidence"),
    ("evidence nested", encode(JUDGMENT | {"evidence": {"clicks": {"n": 9}}}), "invalid_evidence"),
    ("evidence oversize", encode(JUDGMENT | {"evidence": {f"k{i}": i for i in range(17)}}), "invalid_evidence"),
    ("duplicate evidence key", encode(JUDGMENT | {"evidence": {}}).replace(b"{}", b'{"n": 1, "n": 2}'),
     "duplicate_key"),
    ("segment list", encode(IMPRESSION | {"segment": ["variant"]}), "invalid_segment"),
    ("segment number value", encode(IMPRESSION | {"segment": {"variant": 2}}), "invalid_segment"),
    ("segment key empty", encode(IMPRESSION | {"segment": {"": "B"}}), "invalid_segment"),
    ("segment key oversize", encode(IMPRESSION | {"segment": {"k" * 513: "B"}}), "invalid_segment"),
    ("segment value oversize", encode(IMPRESSION | {"segment": {"variant": "B" * 513}}), "invalid_segment"),
    ("segment too many keys", encode(IMPRESSION | {"segment": {f"k{i}": "v" for i in range(17)}}), "oversize_segment"),
    ("no grade", encode(without(JUDGMENT, "grade")), "missing_grade"),
    ("grade string", encode(JUDGMENT | {"grade": "2"}), "invalid_grade"),
    ("grade boolean", encode(JUDGMENT | {"grade": True}), "invalid_grade"),
    ("grade huge", encode(JUDGMENT | {"grade": 1e300}), "grade_out_of_range"),
    ("grade huge integer", encode(JUDGMENT | {"grade": 10**400}), "grade_out_of_range"),
    ("grade tiny", encode(JUDGMENT | {"grade": -5e-324}), "grade_out_of_range"),
    ("lone surrogate in an id", b'{"type":"judgment","query_id":"q\\ud800","doc_id":"d","grade":1,"ts":1}',
     "invalid_string"),
    ("lone surrogate in a result", encode(IMPRESSION).replace(b'"d4"', b'"\\udfff"'), "invalid_string"),
    ("arrays nested too deeply", encode(IMPRESSION)[:-1] + b', "extra": ' + b"[" * 2000 + b"]" * 2000 + b"}",
     "not_json"),
    ("message too large", encode(IMPRESSION | {"pad": "x" * 1_048_576}), "message_too_large"),
]
