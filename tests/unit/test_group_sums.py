"""A group's kept sums: equal to the sums found from scratch bit for bit after any changes, after
thousands of grade moves on one group too, and the work of an event counted: an impression costs
its list's places and a judgment the places its document is shown, however many lists the
group holds."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg import list_squares, list_terms
from stream_ndcg.core_build import core_build
from stream_ndcg.engine import Engine
from stream_ndcg.group_sums import GroupSums
from stream_ndcg.list_squares import ListSquares
from stream_ndcg.metric import Ideal, Measure, ideal_dcg, list_sums, pooled_sums, score_list
from stream_ndcg.offline.replay import Replay
from stream_ndcg.query_state import Group, QueryState
from stream_ndcg.vocabulary import IMPRESSIONS, MOMENTS, AggregateKey, dcg_at, dcg_squares_at, judged_at, ndcg_at
from tests.support.batches import parsed

DOCS = [f"d{i}" for i in range(12)]
CUTOFFS = (3, 10)

changes = st.lists(st.one_of(
    st.tuples(st.just("list"), st.lists(st.sampled_from(DOCS), max_size=12).map(tuple), st.integers(1, 3)),
    st.tuples(st.just("grade"), st.sampled_from(DOCS), st.sampled_from([None, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0]))),
    max_size=60)


@given(changes, st.sampled_from(["exponential", "linear"]), st.integers(1, 5))
def test_kept_sums_equal_the_sums_from_scratch_bit_for_bit(
        steps: list[tuple[Any, ...]], gain: str, sync_every: int) -> None:
    measure = Measure(cutoffs=CUTOFFS, gain=gain)  # type: ignore[arg-type]
    group = Group()
    grades: dict[str, float] = {}
    gains: dict[str, float] = {}
    before: dict[str, float | None] = {}
    group.sums = GroupSums(group, gains, CUTOFFS, pooled=True)
    for number, (kind, first, second) in enumerate(steps, start=1):
        if kind == "list":
            group.add_list(first, second, measure.depth)
        else:
            before.setdefault(first, gains.get(first))
            if second is None:
                grades.pop(first, None)
                gains.pop(first, None)
            else:
                grades[first], gains[first] = second, measure.gain_of(second)
        if number % sync_every == 0 or number == len(steps):
            group.sums.sync(group, gains, before, set(before))
            before = {}
            fresh = pooled_sums(((gains[d], at) for d, at in group.ranks.items() if d in gains),
                                max(1, sum(group.lists.values())), {k: 1.0 for k in CUTOFFS})
            dcgs, judged = group.sums.totals()
            assert dcgs == [fresh[dcg_at(k)] for k in CUTOFFS]
            assert [count / k for count, k in zip(judged, CUTOFFS, strict=True)] == [
                fresh[judged_at(k)] for k in CUTOFFS]
            assert group.sums.exposure(group, grades) == GroupSums(group, grades, CUTOFFS, pooled=False).exposure(
                group, grades)


def _messages(moves: int) -> Iterator[bytes]:
    """40 distinct lists of one group, then `moves` grade moves of its documents, alternating
    between grades (a retraction among them), with an impression every tenth."""
    for i in range(40):
        results = [DOCS[(i * 7 + j * (1 + i % 5)) % len(DOCS)] for j in range(10)]
        yield json.dumps({"type": "impression", "impression_id": f"i{i}", "query_id": "q", "ts": i,
                          "results": results}).encode()
    for i in range(moves):
        grade = [3, 0.5, None, 2][i % 4]
        yield json.dumps({"type": "judgment", "query_id": "q", "doc_id": DOCS[i % 5], "grade": grade,
                          "ts": 100 + i}).encode()
        if i % 10 == 9:
            yield json.dumps({"type": "impression", "impression_id": f"m{i}", "query_id": "q", "ts": 100 + i,
                              "results": DOCS[i % 7:i % 7 + 10]}).encode()


def _from_scratch(group: Group, grades: dict[str, float], measure: Measure) -> dict[str, float]:
    """The definitions' sums of the group: its lists scored one by one, or pooled."""
    if measure.ideal == "list":
        sums = list_sums(((score_list(ranked, grades, measure), count) for ranked, count in group.lists.items()),
                         measure.cutoffs)
    else:
        gains = {doc: measure.gain_of(grade) for doc, grade in grades.items()}
        squares = ListSquares().sums(group.lists, gains, measure.cutoffs, set())
        sums = pooled_sums(((gains[d], at) for d, at in group.ranks.items() if d in gains), group.impressions,
                           {k: ideal_dcg(gains.values(), k) for k in measure.cutoffs}, squares)
    return {IMPRESSIONS: float(group.impressions), **sums, MOMENTS: float(group.impressions)}


@pytest.mark.parametrize("ideal", ["pool", "list"])
def test_thousands_of_grade_moves_on_one_group_leave_its_sums_exact(ideal: Ideal) -> None:
    measure = Measure(cutoffs=CUTOFFS, gain="exponential", ideal=ideal)
    engine = Engine(measure)
    states: dict[str, QueryState] = {}
    known: dict[str, int] = {}
    aggregates: dict[AggregateKey, float] = {}
    replay = Replay(measure)
    messages = list(_messages(4000))
    # One or two events a batch: every move credited on its own, the group kept from batch to batch.
    for start in range(0, len(messages), 2):
        batch = messages[start:start + 2]
        outcome = engine.apply(parsed(batch), states, known)
        states.update(outcome.touched)
        for key, change in outcome.aggregates.items():
            aggregates[key] = aggregates.get(key, 0.0) + change
        for message in batch:
            replay.add(message)
    state = states["q"]
    (group,) = state.groups.values()
    assert group.impressions == 440
    # Bit for bit: what the group credited is what the definitions give from scratch.
    assert group.credited == _from_scratch(group, state.grades(measure.sources), measure)
    # And what the aggregates hold (a chain of 2,000 credited differences) is the replay's to 1e-9.
    rows = list(replay.per_impression())
    assert len(rows) == 440
    for k in CUTOFFS:
        expected = {dcg_at(k): math.fsum(row["dcg"][str(k)] for row in rows),
                    ndcg_at(k): math.fsum(row["ndcg"][str(k)] or 0.0 for row in rows),
                    dcg_squares_at(k): math.fsum(row["dcg"][str(k)] ** 2 for row in rows)}
        for name, value in expected.items():
            assert aggregates[(0, "{}", name)] == pytest.approx(value, rel=1e-9, abs=1e-9), name


class _Counted:
    """Counts the calls of the functions it is told of, by name (or what each call takes on)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self.monkeypatch = monkeypatch

    def count(self, owner: Any, name: str, each: Callable[..., int] = lambda *args: 1) -> None:
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + each(*args)
            return original(*args, **kwargs)

        self.monkeypatch.setattr(owner, name, counted)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> _Counted:
    """The work of an event: the places whose terms move, and the lists scored (their squares under
    the pool ideal, their terms under the list's). Clear `calls` once the group is built."""
    if core_build().core == "compiled":
        # Compiled modules call each other directly, past the patched attributes.
        pytest.skip("counts calls by patching the pure core's functions: the pure run (make test-pure) counts them")
    counts = _Counted(monkeypatch)
    counts.count(GroupSums, "_place")
    # The lists it scores: a call of list_dcgs scores many, of masked_dcgs one (a rescoring).
    counts.count(list_squares, "list_dcgs", lambda tops, *_: len(tops))
    counts.count(list_squares, "masked_dcgs")
    counts.count(list_terms, "score_list")
    return counts


class _Walked(dict[Any, Any]):
    """A dict that counts how often it is walked whole."""

    walks = 0

    def items(self) -> Any:
        _Walked.walks += 1
        return super().items()

    def values(self) -> Any:
        _Walked.walks += 1
        return super().values()

    def __iter__(self) -> Any:
        _Walked.walks += 1
        return super().__iter__()


def _group_of(lists: int, ideal: Ideal) -> tuple[Engine, dict[str, QueryState], Group]:
    """One query with a group of `lists` distinct lists, half its documents judged, credited once."""
    engine = Engine(Measure(cutoffs=CUTOFFS, ideal=ideal))
    docs = [f"d{i}" for i in range(lists + 10)]
    messages = [json.dumps({"type": "judgment", "query_id": "q", "doc_id": doc, "grade": i % 4, "ts": 0}).encode()
                for i, doc in enumerate(docs) if i % 2 == 0]
    messages += [json.dumps({"type": "impression", "impression_id": f"i{i}", "query_id": "q", "ts": 1,
                             "results": docs[i:i + 10]}).encode() for i in range(lists)]
    states: dict[str, QueryState] = {}
    states.update(engine.apply(parsed(messages), states, {}).touched)
    (group,) = states["q"].groups.values()
    group.ranks, group.lists = _Walked(group.ranks), _Walked(group.lists)
    if group.terms is not None:
        group.terms.lists_of = group.lists
    _Walked.walks = 0
    return engine, states, group


@pytest.mark.parametrize("ideal", ["pool", "list"])
@pytest.mark.parametrize("lists", [20, 400])
def test_an_impression_costs_its_lists_places_whatever_the_group_holds(
        lists: int, ideal: Ideal, counted: _Counted) -> None:
    engine, states, group = _group_of(lists, ideal)
    counted.calls.clear()
    shown = ["new", *list(dict.keys(group.ranks))[:9]]
    event = json.dumps({"type": "impression", "impression_id": "new", "query_id": "q", "ts": 2,
                        "results": shown}).encode()
    outcome = engine.apply(parsed([event]), states, {})
    assert outcome.rows and _Walked.walks == 0
    # A term for each of its judged places (d0, d2, d4, d6, d8); the others only counted at their rank.
    assert counted.calls["_place"] == 5
    # The new list scored once (its squares under the pool ideal, its terms under the list's).
    assert counted.calls.get("list_dcgs", 0) + counted.calls.get("score_list", 0) == 1


@pytest.mark.parametrize("ideal", ["pool", "list"])
@pytest.mark.parametrize("lists", [20, 400])
def test_a_judgment_costs_the_places_its_document_is_shown_whatever_the_group_holds(
        lists: int, ideal: Ideal, counted: _Counted) -> None:
    engine, states, group = _group_of(lists, ideal)
    counted.calls.clear()
    # d4 is judged (grade 0) and shown in five lists, at five ranks: its grade moves.
    assert len(dict.__getitem__(group.ranks, "d4")) == 5
    event = json.dumps({"type": "judgment", "query_id": "q", "doc_id": "d4", "grade": 3, "ts": 2}).encode()
    outcome = engine.apply(parsed([event]), states, {})
    assert outcome.rows and _Walked.walks == 0
    # Each place's term taken out with the old gain and put in with the new.
    assert counted.calls["_place"] == 2 * 5
    assert counted.calls.get("masked_dcgs", 0) + counted.calls.get("score_list", 0) == 5


def test_the_walk_left_is_the_most_exposed_unjudged_documents_judgment() -> None:
    group = Group()
    for ranked in [("a", "b", "c"), ("a", "c", "b"), ("b", "c")]:
        group.add_list(ranked, 1, 10)
    sums = group.sums = GroupSums(group, {}, (3,), pooled=False)
    # "b" holds the most: 1 at rank 1, 1/log2(3) at 2, 1/2 at 3.
    assert sums.exposure(group, {})[2] == pytest.approx(1 + 1 / math.log2(3) + 0.5)
    group.add_list(("c",), 2, 10)
    sums.sync(group, {}, {}, set())
    # "c" now holds the most: found from its own places, nothing else walked.
    assert sums.top is not None and sums.top[0][1] == "c"
    sums.sync(group, {"c": 1.0}, {"c": None}, {"c"})
    assert sums.top is None
    assert sums.exposure(group, {"c": 1.0}) == GroupSums(group, {"c": 1.0}, (3,), pooled=False).exposure(
        group, {"c": 1.0})
    assert sums.top is not None and sums.top[0][1] == "b"


lists_and_asks = st.lists(st.one_of(
    st.tuples(st.just("list"), st.lists(st.sampled_from(DOCS), min_size=1, max_size=4).map(tuple), st.integers(1, 3)),
    st.tuples(st.just("unlisted"), st.integers(1, 3)),
    st.tuples(st.just("ask"),)), max_size=40)


@given(st.dictionaries(st.lists(st.sampled_from(DOCS), min_size=1, max_size=4).map(tuple), st.integers(1, 3),
                       max_size=4), st.integers(0, 2), lists_and_asks)
def test_whether_a_group_holds_all_its_lists_is_the_count_of_its_lists(
        stored: dict[tuple[str, ...], int], unlisted: int, steps: list[tuple[Any, ...]]) -> None:
    # As a store reads a group: its impressions, and the lists it found of them (perhaps not all).
    group = Group(impressions=sum(stored.values()) + unlisted, lists=dict(stored))
    for step in steps:
        if step[0] == "list":
            group.impressions += step[2]
            group.add_list(step[1], step[2], 10)
        elif step[0] == "unlisted":
            # Impressions whose lists are not known (a group of an older format).
            group.impressions += step[1]
        else:
            assert group.lists_complete() == (sum(group.lists.values()) == group.impressions)
    assert group.lists_complete() == (sum(group.lists.values()) == group.impressions)
