"""The drill-down's figures over queries, kept running: each move of a query's sums, and the
changes an index settles only when asked, give the figures computed afresh from what is held."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.comparisons import clustered_mean, query_mean
from stream_ndcg.drilldown.index import QueryIndex
from stream_ndcg.drilldown.spread import QuerySpread
from stream_ndcg.rows import row_fields

# Sums of many orders of magnitude, down to the least doubles: the grid must follow the finest.
sums = st.one_of(st.floats(0.0, 50.0), st.floats(0.0, 1e-300), st.integers(0, 40).map(float))
cells = st.tuples(st.integers(1, 30).map(float), sums)
moves = st.lists(st.tuples(st.integers(0, 8), st.none() | cells), min_size=1, max_size=60)


def afresh(held: dict[int, tuple[float, float]]) -> QuerySpread:
    spread = QuerySpread()
    for cell in held.values():
        spread.move(None, cell)
    return spread


@given(moves)
def test_a_spread_moved_query_by_query_gives_the_figures_of_what_it_holds(steps: list[
        tuple[int, tuple[float, float] | None]]) -> None:
    spread = QuerySpread()
    held: dict[int, tuple[float, float]] = {}
    for query, cell in steps:
        spread.move(held.pop(query, None), cell)
        if cell is not None:
            held[query] = cell
        # Exact sums: what was taken out leaves no trace, whatever the order of the moves.
        assert spread.figures() == afresh(held).figures()
        error, mean = spread.figures()
        estimate = clustered_mean(held.values())
        assert (error is None) == (estimate is None)
        # To the service's 1e-9: the float recomputation rounds (two equal queries can give 1e-118, not 0).
        if error is not None and estimate is not None:
            assert error == pytest.approx(estimate.standard_error, rel=1e-9, abs=1e-9)
        expected_mean = query_mean(held.values())
        assert mean == (None if expected_mean is None else pytest.approx(expected_mean, rel=1e-9, abs=1e-9))


# Row values on a coarse binary grid, so that a query's float sums are exact in any order.
row_values = st.tuples(st.integers(1, 20).map(float), st.integers(0, 160).map(lambda x: x / 8))
# Per request, the rows put before it: (query, bucket, variant, (impressions, nDCG sum)).
Rounds = list[list[tuple[int, int, str, tuple[float, float]]]]
puts = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.sampled_from(["A", "B"]), row_values),
                min_size=1, max_size=40)


def row(impressions: float, ndcg_sum: float) -> tuple[float, ...]:
    # impressions, then the cut-off's nDCG sum, DCG sum, scored impressions and the rest.
    return (impressions, ndcg_sum, 2 * ndcg_sum, impressions, 0.0, 0.0, 0.0, 0.0)


@given(st.lists(puts, min_size=1, max_size=5))
def test_rows_put_between_two_requests_move_the_figures_over_queries_as_a_fresh_index_has_them(
        rounds: Rounds) -> None:
    check_figures_over_queries(QueryIndex(row_fields((5,))), rounds)


class SettlingAtOnce(QueryIndex):
    """An index whose views settle each change as it comes (as one read by pages only does once
    its unsettled queries outnumber its held ones by `UNSETTLED_BEYOND_HELD`)."""

    UNSETTLED_BEYOND_HELD = -1


@given(st.lists(puts, min_size=1, max_size=5))
def test_a_view_settling_unasked_gives_the_same_figures_over_queries(
        rounds: Rounds) -> None:
    check_figures_over_queries(SettlingAtOnce(row_fields((5,))), rounds)


def check_figures_over_queries(index: QueryIndex, rounds: Rounds) -> None:
    fields = index.fields
    final: dict[tuple[int, str, str], tuple[float, ...]] = {}
    for round_ in rounds:
        # A query re-credited several times between two requests: its rows replace each other.
        for query, bucket, variant, values in round_:
            segment = f'{{"variant":"{variant}"}}'
            index.put("t:0", bucket, segment, f"q{query}", row(*values))
            final[(bucket, segment, f"q{query}")] = row(*values)
        fresh = QueryIndex(fields)
        for (bucket, segment, query_id), held in final.items():
            fresh.put("t:0", bucket, segment, query_id, held)
        for wanted in ({"variant": "A"}, {"variant": "B"}, {}):
            ours = index.over_queries(0, 2, wanted)
            assert ours == fresh.over_queries(0, 2, wanted)
            per_query: dict[str, list[float]] = {}
            for (_, segment, query_id), held in final.items():
                if not wanted or f'"{wanted["variant"]}"' in segment:
                    per_query.setdefault(query_id, [0.0, 0.0])
                    per_query[query_id][0] += held[0]
                    per_query[query_id][1] += held[1]
            estimate = clustered_mean([(n, s) for n, s in per_query.values()])
            figure = ours[0]["ndcg_clustered_standard_error"]
            assert (figure is None) == (estimate is None)
            if figure is not None and estimate is not None:
                assert math.isclose(figure, estimate.standard_error, rel_tol=1e-9, abs_tol=1e-12)
            assert ours[0]["queries"] == len(per_query)
