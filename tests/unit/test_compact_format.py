"""State format 7's compact groups (`state.compact_format`): what is written reads back as the
groups it was written from, batch after batch, with only what changed written."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stream_ndcg.engine import Engine
from stream_ndcg.events import parse_event
from stream_ndcg.metric import Measure
from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.state import compact_format, shard_format
from stream_ndcg.state import format as state_format
from stream_ndcg.state.compact_format import (
    PIECE,
    compact_changes,
    groups_from_fields,
    pieces,
    table_of,
    table_text,
)
from stream_ndcg.state.sums_text import numbers_of, numbers_text
from stream_ndcg.stored_lists import decode_lists, position


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_sums_read_back_as_the_same_doubles_in_at_most_twelve_characters_each(values: list[float]) -> None:
    text = numbers_text(values)
    head, _, blob = text.partition("|")
    assert all(len(part) <= 12 for part in head.split(","))
    assert len(blob) <= 4 * math.ceil(8 * head.split(",").count("'") / 3)
    read = numbers_of(text)
    assert read == values
    # Signs too, but for zeros: -0.0 comes back as 0.0.
    assert [math.copysign(1, x) for x in read if x] == [math.copysign(1, x) for x in values if x]


@given(st.lists(st.sampled_from([0.0, 1.0, 2.5, 0.1 + 0.2, 1 / 3, -1 / 7, 2.9485027221412834]), min_size=1,
                max_size=20))
def test_sums_with_repeats_read_back_and_a_long_sum_written_before_costs_no_bytes(values: list[float]) -> None:
    text = numbers_text(values, repeats=True)
    assert numbers_of(text) == values
    head, _, blob = text.partition("|")
    # One double per distinct long sum, and no padding; the others refer to the one written.
    longs = [x for x in values if len(repr(x)) > 12]
    distinct = len(set(longs))
    assert head.split(",").count("'") == distinct
    assert len(blob) == math.ceil(8 * distinct * 4 / 3) and "=" not in blob
    assert sum(1 for part in head.split(",") if part.startswith('"')) == len(longs) - distinct


@given(st.lists(st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.0, -3.0, 1e16, 1e-5, 5e-324, 2.0**53]),
                          st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=20))
@example([0.0, -0.0, 0.0, -0.0, 0.0, 10.0, 0.0, 0.0, -0.0, -0.0, 0.0])
def test_each_short_sum_is_its_shortest_text_without_a_whole_number_s_point_and_a_zero_nothing(
        values: list[float]) -> None:
    """The head of `numbers_text`, found with no step per number, is what writing each number
    alone gives: format 8's texts as they were written before."""
    for repeats in (False, True):
        head = numbers_text(values, repeats=repeats).partition("|")[0].split(",")
        alone = ["" if x == 0 else orjson.dumps(x).decode().removesuffix(".0") for x in values]
        assert len(head) == len(values)
        assert [part for part, text in zip(head, alone, strict=True) if len(text) <= 13] == [
            text for text in alone if len(text) <= 13]
        assert all(part[:1] in ("'", '"') for part, text in zip(head, alone, strict=True) if len(text) > 13)


@given(st.lists(st.integers(0, 5000), max_size=20))
def test_positions_read_back(indices: list[int]) -> None:
    docs = [f"d{i}" for i in range(5001)]
    lists: dict[tuple[str, ...], int] = {}
    decode_lists([("".join(position(i) for i in indices).encode(), b"1")], docs, lists, {})
    assert list(lists) == [tuple(docs[i] for i in indices)]


@given(st.text(max_size=400))
def test_pieces_fit_a_listpack_and_join_back(text: str) -> None:
    cut = pieces("h", text)
    assert all(len(value.encode()) <= PIECE for _, value in cut)
    assert "".join(value for _, value in cut) == text
    assert [name for name, _ in cut] == ["h", *(f"h~{i}" for i in range(1, len(cut)))]


@pytest.mark.parametrize("entries", [[], ["a"], ["d1", "d2"], ["x\x1fy", "z"], ["[not json", "b"], ["é" * 40]])
def test_a_table_reads_back(entries: list[str]) -> None:
    assert table_of(table_text(entries)) == entries


def stored(fields: dict[str, str], written: list[str], removed: list[str], afresh: bool) -> dict[str, str]:
    held = {} if afresh else dict(fields)
    held.update(zip(written[::2], written[1::2], strict=True))
    for name in removed:
        held.pop(name, None)
    return held


def as_read(fields: dict[str, str]) -> QueryState:
    state = QueryState()
    groups_from_fields(state, {name.encode(): value.encode() for name, value in fields.items()})
    return state


def test_batches_written_read_back_as_the_engines_groups_and_write_only_what_changed() -> None:
    measure = Measure(cutoffs=(3, 10))
    engine = Engine(measure, 60_000, horizon_ms=300_000)
    state = QueryState()
    known: dict[str, int] = {}
    fields: dict[str, str] = {}
    afresh = 0
    shown = '{"type":"impression","impression_id":"%d","query_id":"q","ts":%d,"results":%s,"segment":{"v":"%s"}}'
    judged = '{"type":"judgment","query_id":"q","doc_id":"%s","grade":%d,"ts":%d}'
    ts = 1_763_683_200_000
    for batch in range(30):
        events = [parse_event((shown % (batch * 10 + n, ts, str([f"d{2 * batch + n + i}" for i in range(6)])
                                        .replace("'", '"'), "AB"[n % 2])).encode()) for n in range(4)]
        events.append(parse_event((judged % (f"d{2 * batch}", batch % 4, ts)).encode()))
        outcome = engine.apply(events, {"q": state}, known, ts, event_clock=True)
        state = outcome.touched["q"]
        change = outcome.changes["q"]
        changed: dict[tuple[int, str], list[tuple[str, ...]]] = {}
        for (_, bucket, segment, ranked) in outcome.lists:
            changed.setdefault((bucket, segment), []).append(ranked)
        write = compact_changes(state, change.dirty, change.removed, changed)
        fields = stored(fields, write.written, write.removed, write.afresh)
        afresh += write.afresh
        read = as_read(fields)
        assert read.groups.keys() == state.groups.keys()
        for key, group in state.groups.items():
            again = read.groups[key]
            assert (again.impressions, again.lists, again.ranks) == (group.impressions, group.lists, group.ranks)
            assert again.credited == group.credited
        # A batch of 4 impressions writes their lists and its groups' headers, not every list held.
        if not write.afresh:
            assert len([name for name in write.written[::2] if ":" in name]) <= 4
        assert all(len(name.encode()) <= PIECE and len(value.encode()) <= PIECE for name, value in fields.items())
        ts += 45_000
    # The documents shown drift: the table, grown stale, was written afresh.
    assert afresh > 0
    # Old buckets went behind the horizon: their groups and lists went from the hash.
    assert {name.split(".")[0] for name in fields if name[0].isdigit()} == {str(b) for b, _ in state.groups}


def test_a_group_without_the_lists_of_all_its_impressions_is_not_stored_compact() -> None:
    assert not compact_format.whole_lists(Group(impressions=3, lists={("a",): 2}))
    assert compact_format.whole_lists(Group(impressions=3, lists={("a",): 2, ("b", "a"): 1}))


def test_a_hash_whose_last_group_went_is_removed_whole() -> None:
    state = QueryState()
    state.groups[(1, "{}")] = Group(impressions=1, credited={"impressions": 1.0}, ranks={"a": {1: 1}},
                                    lists={("a",): 1})
    first = compact_changes(state, [(1, "{}")], [], {})
    assert {"d", "s", "1.0", "1.0:" + position(0)} <= set(first.written[::2]) and not first.afresh
    del state.groups[(1, "{}")]
    assert compact_changes(state, [], [(1, "{}")], {}) == compact_format.CompactWrite([], [], afresh=True)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=22))
@example([1e12])
def test_a_row_of_format_8_7_or_6_reads_back(values: list[float]) -> None:
    row = tuple(values)
    dense = shard_format.encode_row(row)
    assert shard_format.decode_row(dense) == row == shard_format.decode_row(dense.encode())
    assert shard_format.decode_row(state_format.encode_row(row)) == row
    assert shard_format.decode_row(shard_format.encode_row_8(row)) == row
    assert len(shard_format.encode_row_8(row)) <= len(dense) <= len(state_format.encode_row(row))


# Document ids as they come: any text, \x1f and non-ASCII included, some opening with '[' (the
# table is then written as JSON).
DOC_IDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8) | st.sampled_from(["[x", "a\x1fb", "é"])


@st.composite
def stored_groups(draw: st.DrawFn) -> QueryState:
    """A query's groups as the engine leaves them (each list added by `Group.add_list`, cut at its
    depth), over a pool of documents that may be larger than one character's worth of indices."""
    drawn = draw(st.lists(DOC_IDS, min_size=1, max_size=20, unique=True))
    # Enough more, at times, for the indices past one character's (93).
    docs = list(dict.fromkeys([*drawn, *(f"n{i}" for i in range(draw(st.sampled_from([0, 10, 120]))))]))
    state = QueryState()
    # A segment key is JSON, never empty (an empty one alone would be an empty table).
    segments = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3, unique=True))
    for _ in range(draw(st.integers(1, 4))):
        key = (draw(st.integers(0, 10**9)), draw(st.sampled_from(segments)))
        names = state_format.sums_in_stored_order((3, 10), draw(st.booleans()))
        sums = st.floats(allow_nan=False, allow_infinity=False)
        credited = dict(zip(names, draw(st.lists(sums, min_size=len(names), max_size=len(names))), strict=True))
        if draw(st.booleans()):
            # Any other sums: stored by name.
            credited = draw(st.dictionaries(st.text(max_size=5), sums, max_size=3))
        group = state.groups[key] = Group(credited=credited)
        shown = draw(st.lists(st.lists(st.sampled_from(docs), min_size=1, max_size=12), max_size=12))
        if draw(st.booleans()):
            # Every document of the pool in one list: past the 93rd, its index is '!<n>!'.
            shown.append(list(docs))
        for ranked in shown:
            count = draw(st.integers(1, 5))
            group.add_list(tuple(ranked), count, len(ranked))
            group.impressions += count
    return state


def long_and_repeating_lists() -> QueryState:
    group = Group(impressions=5)
    for ranked, count in [(tuple(f"d{i}" for i in range(100)), 2), (("d99", "é", "d99", "a\x1fb", "d5"), 3)]:
        group.add_list(ranked, count, len(ranked))
    return QueryState(groups={(7, "{}"): group})


@given(stored_groups())
@example(long_and_repeating_lists())
def test_groups_written_read_back_as_they_were_lists_and_ranks_in_their_order(state: QueryState) -> None:
    write = compact_changes(state, list(state.groups), [], {})
    read = as_read(stored({}, write.written, write.removed, write.afresh))
    assert list(read.groups) == list(state.groups)
    for key, group in state.groups.items():
        again = read.groups[key]
        assert (again.impressions, again.credited) == (group.impressions, group.credited)
        assert list(again.lists.items()) == list(group.lists.items())
        assert [(doc, list(at.items())) for doc, at in again.ranks.items()] == [
            (doc, list(at.items())) for doc, at in group.ranks.items()]
        # As a group read back from the store always was: its counts of impressions listed and by
        # rank found on first use, its ranks not changed since.
        assert (again._listed, again._shown_at, again.ranks_changes) == (None, None, 0)
        assert compact_format.holds(read, key)
    written_tables = compact_format._TABLES.get(state)
    read_tables = compact_format._TABLES.get(read)
    assert written_tables is not None and read_tables is not None
    assert (read_tables.docs, read_tables.doc_index, read_tables.segments, read_tables.segment_index,
            read_tables.piece_counts) == (written_tables.docs, written_tables.doc_index, written_tables.segments,
                                          written_tables.segment_index, written_tables.piece_counts)
