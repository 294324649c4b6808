"""The stored form of the state: round trips, the incremental write, and the format version."""

from __future__ import annotations

import orjson
import pytest

from stream_ndcg import state_format
from stream_ndcg.engine import Engine, QueryState
from stream_ndcg.errors import ConfigError
from stream_ndcg.events import parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.store import MemoryStore

T0 = 1_763_683_200_000
BATCHES = [
    [b'{"type":"impression","impression_id":"1","query_id":"q","ts":%d,"results":["a","b","a"],'
     b'"segment":{"variant":"A|B"}}' % T0,
     b'{"type":"judgment","query_id":"q","doc_id":"b","grade":2,"ts":%d}' % T0],
    [b'{"type":"impression","impression_id":"2","query_id":"q","ts":%d,"results":["b","c"]}' % (T0 + 60_000),
     b'{"type":"judgment","query_id":"q","doc_id":"b","grade":3,"ts":%d}' % (T0 + 1),
     b'{"type":"judgment","query_id":"q","doc_id":"c","grade":null,"ts":%d,"event_id":"e"}' % (T0 + 2)],
    # Late enough that the first bucket falls behind the horizon.
    [b'{"type":"impression","impression_id":"3","query_id":"q","ts":%d,"results":["c"]}' % (T0 + 3 * 60_000)],
]


def apply_like_redis(fields: dict[bytes, bytes], written: list[str], removed: list[str],
                     appended: list[list[str]]) -> None:
    """What the commit script does to the query's hash."""
    fields.update({name.encode(): value.encode() for name, value in zip(written[::2], written[1::2], strict=True)})
    for name in removed:
        fields.pop(name.encode(), None)
    for name, tail in appended:
        held = fields.get(name.encode())
        fields[name.encode()] = (held[:-1] + b"," + tail.encode() + b"]") if held else b"[" + tail.encode() + b"]"


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_the_incremental_write_holds_what_the_whole_state_encodes(ideal: str) -> None:
    engine = Engine(Measure(cutoffs=(1, 3), ideal=ideal), 60_000, horizon_ms=90_000)  # type: ignore[arg-type]
    stored: dict[bytes, bytes] = {}
    for batch in BATCHES:
        states = {"q": state_format.state_from_fields(stored)} if stored else {}
        outcome = engine.apply([parse_event(m) for m in batch], states, {}, T0, event_clock=True)
        apply_like_redis(stored, *state_format.changed_fields(outcome.touched["q"], outcome.changes["q"]))
        assert state_format.state_from_fields(stored) == outcome.touched["q"]
        assert {k: orjson.loads(v) for k, v in stored.items()} == {
            k: orjson.loads(v) for k, v in state_format.state_fields(outcome.touched["q"]).items()}
    assert len(outcome.touched["q"].groups) == 2 and outcome.changes["q"].removed


def test_a_state_round_trips_with_its_ranks_as_integers() -> None:
    engine = Engine(Measure(cutoffs=(3,)))
    state = engine.apply([parse_event(m) for m in BATCHES[0]], {}, {}).touched["q"]
    again = state_format.state_from_fields(state_format.state_fields(state))
    assert again == state and again is not state
    assert all(isinstance(rank, int) for group in again.groups.values() for at in group.ranks.values() for rank in at)
    assert again.grades() == {"b": 2.0}


def test_list_and_aggregate_fields_decode_to_what_was_encoded() -> None:
    positions = {"y": 0, "x": 1, "z": 2}
    field = state_format.list_field('{"v":"a|b"}', ("x", "y", "x"), positions)
    assert len(field) == len('{"v":"a|b"}') + len("\x1f1,0,1")
    documents = {'{"v":"a|b"}': ["y", "x", "z"]}
    assert state_format.decode_list_field(field.encode(), documents) == ('{"v":"a|b"}', ("x", "y", "x"))
    assert state_format.decode_list_field(state_format.list_field("", (), {}), {"": []}) == ("", ())
    # A list of a group that is gone; and a list written by format 1.
    assert state_format.decode_list_field(field, {}) is None
    assert state_format.decode_list_field(b'["{}", ["a", "b"]]', {}) == ("{}", ("a", "b"))
    aggregate = state_format.aggregate_field('{"v":"a|b"}', "ndcg@10").encode()
    assert state_format.decode_aggregate_field(aggregate) == ('{"v":"a|b"}', "ndcg@10")
    assert float(state_format.encode_sum(0.1 + 0.2)) == 0.1 + 0.2


@pytest.mark.parametrize("found", [None, "1", str(state_format.FORMAT_VERSION)])
def test_todays_format_the_previous_one_and_state_without_a_version_are_read(found: str | None) -> None:
    state_format.check_format(found)


@pytest.mark.parametrize("found", ["3", "0", "v1", "", "1,2"])
def test_another_format_is_refused_saying_what_was_found(found: str) -> None:
    with pytest.raises(ConfigError, match=f"format version {found!r}, and this release reads versions 1 and 2 only"):
        state_format.check_format(found)


def test_the_memory_store_records_the_format_and_refuses_another_rebuild_or_not() -> None:
    store = MemoryStore()
    assert store.format_version is None
    assert store.adopt({"k": [10]}) is False
    assert store.format_version == str(state_format.FORMAT_VERSION)
    # As if a later release had written the state.
    store.format_version = "3"
    for rebuild in (False, True):
        with pytest.raises(ConfigError, match="format version '3'"):
            store.adopt({"k": [10]}, rebuild=rebuild)
    assert store.format_version == "3"


def test_a_query_state_without_fields_is_empty() -> None:
    assert state_format.state_from_fields({}) == QueryState()
