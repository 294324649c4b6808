"""The stored form of the state: round trips, the incremental write, and the format version."""

from __future__ import annotations

import gc

import orjson
import pytest

from stream_ndcg.engine import Engine
from stream_ndcg.errors import ConfigError
from stream_ndcg.events import parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state import format as state_format
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.vocabulary import DEFAULT_JUDGMENT_SOURCES

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
    # The buckets' lists, as a store keeps them: a group of the pool ideal is stored without its own.
    lists: dict[tuple[int, str, tuple[str, ...]], int] = {}

    def read_back() -> QueryState:
        state = state_format.state_from_fields(stored)
        for (bucket, segment), group in state.groups.items():
            if not group.lists_stored:
                group.lists = {ranked: n for (b, s, ranked), n in lists.items() if (b, s) == (bucket, segment)}
        return state

    for batch in BATCHES:
        states = {"q": read_back()} if stored else {}
        outcome = engine.apply([parse_event(m) for m in batch], states, {}, T0, event_clock=True)
        apply_like_redis(stored, *state_format.changed_fields(outcome.touched["q"], outcome.changes["q"]))
        for (_, bucket, segment, ranked), count in outcome.lists.items():
            lists[(bucket, segment, ranked)] = lists.get((bucket, segment, ranked), 0) + count
        assert read_back() == outcome.touched["q"]
        assert {k: orjson.loads(v) for k, v in stored.items()} == {
            k: orjson.loads(v) for k, v in state_format.state_fields(outcome.touched["q"]).items()}
    assert len(outcome.touched["q"].groups) == 2 and outcome.changes["q"].removed


def test_a_state_round_trips_with_its_ranks_as_integers() -> None:
    engine = Engine(Measure(cutoffs=(3,)))
    state = engine.apply([parse_event(m) for m in BATCHES[0]], {}, {}).touched["q"]
    again = state_format.state_from_fields(state_format.state_fields(state))
    # Under the pool ideal a group is stored without its lists: the store gives them from the bucket's.
    assert all(not group.lists_stored and not group.lists for group in again.groups.values())
    for key, group in again.groups.items():
        group.lists = dict(state.groups[key].lists)
    assert again == state and again is not state
    assert all(isinstance(rank, int) for group in again.groups.values() for at in group.ranks.values() for rank in at)
    assert again.grades(DEFAULT_JUDGMENT_SOURCES) == {"b": 2.0}


def judgment(doc: str, grade: float | None, ts: int, source: str | None = None) -> bytes:
    fields = {"type": "judgment", "query_id": "q", "doc_id": doc, "grade": grade, "ts": ts}
    return orjson.dumps(fields | ({"source": source} if source else {}))


def test_raters_events_are_stored_as_format_3_stored_them_and_others_with_their_source() -> None:
    engine = Engine(Measure(cutoffs=(3,)))
    outcome = engine.apply([parse_event(judgment("a", 2, T0)), parse_event(judgment("a", 1, T0, "coec"))], {}, {})
    written, _, appended = state_format.changed_fields(outcome.touched["q"], outcome.changes["q"])
    assert not written
    assert appended == [["r|a", f'[{T0},null,2.0],[{T0},null,1.0,"coec"]']]
    assert state_format.state_fields(outcome.touched["q"]) == {
        b"r|a": f'[[{T0},null,2.0],[{T0},null,1.0,"coec"]]'.encode()}


def test_a_state_of_format_3_reads_as_raters_grades_and_takes_other_sources_beside_them() -> None:
    """Format 3 held every judgment as raters' (the service ignored a `source` field then): a
    click model's grades fill in around them, and a retracted rater's grade gives way to one."""
    stored = {b"r|a": f'[[{T0},"e1",1.0]]'.encode(), b"r|c": f'[[{T0},null,3.0]]'.encode()}
    engine = Engine(Measure(cutoffs=(3,)))
    events = [judgment("a", 3, T0 + 1, "coec"), judgment("b", 2, T0 + 1, "coec"), judgment("c", 0, T0 + 1, "sdbn")]
    outcome = engine.apply([parse_event(m) for m in events], {"q": state_format.state_from_fields(stored)}, {})
    apply_like_redis(stored, *state_format.changed_fields(outcome.touched["q"], outcome.changes["q"]))
    state = state_format.state_from_fields(stored)
    assert state.grades(DEFAULT_JUDGMENT_SOURCES) == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert state.grades(("coec", "raters")) == {"a": 3.0, "b": 2.0, "c": 3.0}
    outcome = engine.apply([parse_event(judgment("a", None, T0 + 2)), parse_event(judgment("c", None, T0 + 2))],
                           {"q": state}, {})
    assert outcome.changes["q"].docs == {"a", "c"}
    assert outcome.touched["q"].grades(DEFAULT_JUDGMENT_SOURCES) == {"a": 3.0, "b": 2.0, "c": 0.0}


def test_a_group_is_stored_with_its_figures_by_position_and_read_back_equal() -> None:
    group = Group(impressions=3, credited={"impressions": 3.0, "dcg@3": 2.5, "judged@3": 1 / 3, "ndcg@3": 0.1 + 0.2,
                                           "scored@3": 2.0, "dcg@1": 1e300, "judged@1": -0.0, "ndcg@1": 0.0,
                                           "scored@1": 0.0},
                  ranks={"b": {1: 1, 3: 2}, "a": {2: 3}}, lists={("b", "a"): 1})
    stored = state_format.encode_group(group)
    assert '[[3,1],3,2.5,0.3333333333333333,0.30000000000000004,2,1e+300,-0,0,0]' in stored
    assert '"b",1,[3,2],"a",[2,3]' in stored
    again = state_format.decode_group(stored)
    assert again == group
    assert list(again.ranks) == ["b", "a"] and all(type(v) is float for v in again.credited.values())
    # Kept until the ranks change, and then encoded anew.
    assert state_format.decode_group(state_format.encode_group(again)) == group
    again.add_list(("c",), 1, 3)
    assert state_format.decode_group(state_format.encode_group(again)).ranks["c"] == {1: 1}


def test_a_group_with_its_squares_is_stored_by_position_and_read_back_equal() -> None:
    credited = {"impressions": 2.0, "moments": 2.0, "dcg@3": 1.5, "judged@3": 0.5, "ndcg@3": 0.25, "scored@3": 1.0,
                "dcg_sq@3": 2.25, "ndcg_sq@3": 0.0625}
    group = Group(impressions=2, credited=credited, ranks={"a": {1: 2}}, lists={("a",): 2})
    stored = state_format.encode_group(group)
    assert stored.startswith("[2,[[3],2,2,1.5,0.5,0.25,1,2.25,0.0625],")
    assert state_format.decode_group(stored) == group


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_a_group_of_format_4_takes_its_squares_when_re_credited_with_all_its_lists(ideal: str) -> None:
    measure = Measure(cutoffs=(3,), ideal=ideal)  # type: ignore[arg-type]
    engine = Engine(measure)
    lists = [["a", "b"], ["b", "c"], ["a", "b"]]
    events = [parse_event(orjson.dumps({"type": "impression", "impression_id": str(n), "query_id": "q", "ts": T0,
                                        "results": ranked})) for n, ranked in enumerate(lists)]
    events += [parse_event(judgment(doc, grade, T0)) for doc, grade in (("a", 3), ("b", 1))]
    state = engine.apply(events, {}, {}).touched["q"]
    group = state.groups[(engine.bucket_of(T0), "{}")]
    moments = {name: value for name, value in group.credited.items() if "sq@" in name or name == "moments"}
    assert moments["moments"] == 3.0 and moments["dcg_sq@3"] > 0.0
    # As format 4 stored it: no squares, and under the pool ideal no lists.
    old = ["impressions", "dcg@3", "judged@3", "ndcg@3", "scored@3"]
    written_by_format_4 = orjson.dumps([3, [[3], *(group.credited[k] for k in old)], [], [] if ideal == "pool" else
                                        [[list(ranked), count] for ranked, count in group.lists.items()]])
    read = state_format.decode_group(written_by_format_4)
    assert read.credited == {k: group.credited[k] for k in old}
    # Its lists as the store reads them from the bucket's under the pool ideal.
    read.lists, read.ranks = dict(group.lists), group.ranks
    # A judgment of a document no list shows: only the conversion re-credits the group.
    outcome = engine.apply([parse_event(judgment("z", 0, T0))], {"q": QueryState(
        revisions=dict(state.revisions), groups=dict.fromkeys(state.groups, read))}, {})
    assert {name: value for name, value in outcome.aggregates.items() if name[2] in moments} == {
        (key[0], key[1], name): value for key in state.groups for name, value in moments.items()}
    assert read.credited == group.credited


@pytest.mark.parametrize("credited", [{}, {"impressions": 1.0, "dcg@3": 0.5}, {"impressions": 1.0, "other": 2.0}])
def test_figures_that_are_not_all_those_of_their_cutoffs_are_stored_by_name(credited: dict[str, float]) -> None:
    group = Group(impressions=1, credited=credited, ranks={"a": {1: 1}})
    assert state_format.decode_group(state_format.encode_group(group)) == group


def test_a_row_is_written_with_whole_numbers_short_and_read_back_as_the_same_doubles() -> None:
    row = (3.0, 0.0, -0.0, 2.5, 1e-7, 1e16, 123456789012345.0, 0.1 + 0.2, 7.0)
    stored = state_format.encode_row(row)
    assert stored == "3,0,-0,2.5,1e-7,1e+16,123456789012345,0.30000000000000004,7"
    again = state_format.decode_row(stored)
    assert again == row and all(type(value) is float for value in again)


def test_a_group_of_format_2_is_read() -> None:
    written_by_format_2 = ('{"n":2,"c":{"impressions":2.0,"dcg@3":1.5,"judged@3":0.5,"ndcg@3":0.25,"scored@3":1.0},'
                           '"r":{"d3":{"1":1,"3":1},"d1":{"2":2}},"l":[[["d3","d1"],1]]}')
    assert state_format.decode_group(written_by_format_2) == Group(
        impressions=2, credited={"impressions": 2.0, "dcg@3": 1.5, "judged@3": 0.5, "ndcg@3": 0.25, "scored@3": 1.0},
        ranks={"d3": {1: 1, 3: 1}, "d1": {2: 2}}, lists={("d3", "d1"): 1})


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


@pytest.mark.parametrize("found", [None, "1", "2", "3", "4", "5", "6", "7", str(state_format.FORMAT_VERSION)])
def test_todays_format_the_previous_one_and_state_without_a_version_are_read(found: str | None) -> None:
    state_format.check_format(found)


@pytest.mark.parametrize("found", ["9", "0", "v1", "", "1,2"])
def test_another_format_is_refused_saying_what_was_found(found: str) -> None:
    with pytest.raises(ConfigError, match=f"format version {found!r}, and this release reads versions 1, 2, 3, 4, "
                                          "5, 6, 7 and 8 only"):
        state_format.check_format(found)


def test_the_memory_store_records_the_format_and_refuses_another_rebuild_or_not() -> None:
    store = MemoryStore()
    assert store.format_version is None
    assert store.adopt({"k": [10]}) is False
    assert store.format_version == str(state_format.FORMAT_VERSION)
    # As if a later release had written the state.
    store.format_version = "9"
    for rebuild in (False, True):
        with pytest.raises(ConfigError, match="format version '9'"):
            store.adopt({"k": [10]}, rebuild=rebuild)
    assert store.format_version == "9"


def test_a_query_state_without_fields_is_empty() -> None:
    assert state_format.state_from_fields({}) == QueryState()


def test_a_groups_stored_ranks_follow_its_ranks_and_go_with_it() -> None:
    group = Group()
    group.impressions += 1
    group.add_list(("a", "b"), 1, 10)
    first = state_format.encode_group(group)
    assert state_format.encode_group(group) == first
    group.impressions += 1
    group.add_list(("b", "c"), 1, 10)
    again = state_format.encode_group(group)
    # Not the encoding kept from before: the ranks changed.
    assert again != first and state_format.decode_group(again).ranks == group.ranks
    held = state_format._ENCODED_RANKS._held
    assert id(group) in held
    key = id(group)
    del group
    gc.collect()
    assert key not in held or held[key][0]() is not None
