"""The aggregate fields from scored lists: list by list, and pooled from the judged documents' ranks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.list_squares import ListSquares
from stream_ndcg.metric import Measure, ideal_dcg, list_sums, ndcg_sums, pooled_sums, score_list
from stream_ndcg.query_state import Group
from stream_ndcg.vocabulary import dcg_at, dcg_squares_at, judged_at, ndcg_at, ndcg_squares_at, scored_at

docs = st.sampled_from("abcdefg")
lists = st.lists(st.tuples(st.lists(docs, max_size=8).map(tuple), st.integers(1, 4)), min_size=1, max_size=6)
grades = st.dictionaries(docs, st.sampled_from([-1.0, 0.0, 1.0, 2.0, 3.0]))


def test_an_undefined_ndcg_adds_to_neither_sum() -> None:
    assert ndcg_sums([(0.5, 2), (None, 3), (1.5, 4)]) == (2.0, 6.0)
    assert ndcg_sums([(None, 3)]) == (0.0, 0.0)


@given(lists, grades, st.sampled_from(["exponential", "linear"]))
def test_pooled_sums_equal_the_lists_scored_one_by_one(
        shown: list[tuple[tuple[str, ...], int]], judged: dict[str, float], gain: str) -> None:
    measure = Measure(cutoffs=(1, 3, 10), gain=gain)  # type: ignore[arg-type]
    group = Group()
    for ranked, count in shown:
        group.add_list(ranked, count, measure.depth)
    impressions = sum(count for _, count in shown)
    gains = [measure.gain_of(g) for g in judged.values()]
    ideals = {k: ideal_dcg(gains, k) for k in measure.cutoffs}
    squares = ListSquares().sums(group.lists, {d: measure.gain_of(g) for d, g in judged.items()}, measure.cutoffs,
                                 set())
    pooled = pooled_sums(((measure.gain_of(judged[d]), at) for d, at in group.ranks.items() if d in judged),
                         impressions, ideals, squares)
    one_by_one = list_sums(((score_list(ranked, judged, measure), count) for ranked, count in shown),
                           measure.cutoffs)
    assert pooled.keys() == one_by_one.keys() == {name(k) for k in measure.cutoffs for name in (
        dcg_at, ndcg_at, scored_at, judged_at, dcg_squares_at, ndcg_squares_at)}
    for name, value in one_by_one.items():
        assert pooled[name] == pytest.approx(value, abs=1e-9), name
    for k in measure.cutoffs:
        assert pooled[scored_at(k)] == (impressions if ideals[k] > 0 else 0)
