"""`ListSquares`: the sums of squares of a group's lists' DCGs, against each list scored afresh."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.list_squares import ListSquares
from stream_ndcg.metric import discount
from stream_ndcg.vocabulary import dcg_squares_at
from tests.support.grades import move_grades


def squares_scored_afresh(lists: dict[tuple[str, ...], int], gains: dict[str, float], k: int) -> float:
    """The sum over impressions of DCG@k squared (each square rounded, the sum rounded once), each
    list scored on its own (a repeat counted at its first rank)."""
    squares: list[float] = []
    for ranked, count in lists.items():
        firsts = [doc if doc not in ranked[:rank] else None for rank, doc in enumerate(ranked[:k])]
        dcg = math.fsum(gains.get(doc, 0.0) * discount(rank) for rank, doc in enumerate(firsts, 1) if doc)
        squares += [dcg * dcg] * count
    return math.fsum(squares)


def test_a_new_list_taken_twice_between_two_sums_counts_every_impression() -> None:
    squares = ListSquares()
    gains = {"a": 1.0, "b": 3.0}
    lists: dict[tuple[str, ...], int] = {}
    assert squares.sums(lists, gains, (1, 3), set()) == {dcg_squares_at(1): 0.0, dcg_squares_at(3): 0.0}
    shown = [("a", "x", "b"), ("x",), ("a", "x", "b"), ("b", "b", "a"), ("a", "x", "b")]
    for ranked in shown:
        squares.added(ranked, 1)
        lists[ranked] = lists.get(ranked, 0) + 1
    found = squares.sums(lists, gains, (1, 3), set())
    assert found == {dcg_squares_at(k): squares_scored_afresh(lists, gains, k) for k in (1, 3)}
    # At 1: three impressions of a list led by "a" (1.0 squared), one led by "b" (3.0 squared).
    assert found[dcg_squares_at(1)] == 3 * 1.0 + 9.0


def test_a_moved_grade_rescores_the_lists_taken_before_and_after_it() -> None:
    squares = ListSquares()
    gains = {"a": 1.0}
    lists: dict[tuple[str, ...], int] = {}
    squares.sums(lists, gains, (1, 3), set())
    # Past the index's threshold, so that the moved grade finds its lists through the index.
    for n in range(40):
        ranked = (f"d{n}", "x", "a") if n % 2 else (f"d{n}", "a")
        squares.added(ranked, 1 + n % 3)
        lists[ranked] = lists.get(ranked, 0) + 1 + n % 3
    squares.sums(lists, gains, (1, 3), set())
    moved = {"x": 2.0, "a": 1.0}
    squares.added(("x", "a"), 2)
    lists[("x", "a")] = 2
    found = squares.sums(lists, moved, (1, 3), {"x"}, {"x": None})
    for k in (1, 3):
        assert found[dcg_squares_at(k)] == squares_scored_afresh(lists, moved, k)


DOCS = ["a", "b", "c", "d", "e"]
# A grade's gain: None not judged, 0.0 judged with no gain.
GAINS = st.sampled_from([None, 0.0, 1.0, 3.0, 0.1])
RANKED = st.lists(st.sampled_from(DOCS), min_size=1, max_size=6).map(tuple)


@given(st.sampled_from([(1, 3), (3, 1), (2, 5), (5,)]), st.sampled_from([{}, {"a": 1.0}]),
       st.lists(st.tuples(st.lists(st.tuples(RANKED, st.integers(1, 3)), max_size=12),
                          st.dictionaries(st.sampled_from(DOCS), GAINS, max_size=3),
                          st.booleans()),
                min_size=1, max_size=8))
def test_the_squares_kept_through_lists_and_moved_grades_equal_the_lists_scored_afresh(
        cutoffs: tuple[int, ...], first_gains: dict[str, float],
        rounds: list[tuple[list[tuple[tuple[str, ...], int]], dict[str, float | None], bool]]) -> None:
    # Each round: lists taken (a few groups pass the index's threshold), grades moved (a query may
    # have none judged for a while), and whether the lists are told they repeat nothing (the engine
    # tells it of those that do not).
    squares = ListSquares()
    gains = dict(first_gains)
    lists: dict[tuple[str, ...], int] = {}
    squares.sums(lists, gains, cutoffs, set())
    for taken, moves, told in rounds:
        for ranked, count in taken * 2:
            squares.added(ranked, count, told and len(set(ranked)) == len(ranked))
            lists[ranked] = lists.get(ranked, 0) + count
        before = move_grades(gains, moves)
        found = squares.sums(lists, dict(gains), cutoffs, set(moves), before)
        assert found == {dcg_squares_at(k): squares_scored_afresh(lists, gains, k) for k in cutoffs}


def test_a_query_whose_grades_all_go_and_come_again_has_its_lists_scored_afresh() -> None:
    # While no document is judged nothing is kept of the lists; the next grade scores them all.
    squares = ListSquares()
    lists: dict[tuple[str, ...], int] = {}
    squares.sums(lists, {"a": 1.0}, (1, 3), set())
    for ranked in [("a", "b"), ("b", "a", "c"), ("c",)]:
        squares.added(ranked, 2, True)
        lists[ranked] = 2
    assert squares.sums(lists, {"a": 1.0}, (1, 3), set())[dcg_squares_at(3)] > 0
    assert squares.sums(lists, {}, (1, 3), {"a"}, {"a": 1.0}) == {dcg_squares_at(1): 0.0, dcg_squares_at(3): 0.0}
    for ranked in [("b", "c"), ("a", "b")]:
        squares.added(ranked, 1, True)
        lists[ranked] = lists.get(ranked, 0) + 1
    gains = {"b": 3.0}
    found = squares.sums(lists, gains, (1, 3), {"b"}, {"b": None})
    assert found == {dcg_squares_at(k): squares_scored_afresh(lists, gains, k) for k in (1, 3)}
