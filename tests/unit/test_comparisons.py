"""The comparisons' statistics: each formula on a small example worked by hand (in the comments),
and the properties that tie them together (hypothesis)."""

from __future__ import annotations

import doctest
import math
import statistics
from dataclasses import astuple

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stream_ndcg import comparisons
from stream_ndcg.comparisons import (
    Comparison,
    Estimate,
    StratifiedSums,
    against_control,
    always_valid,
    always_valid_half_width,
    bonferroni,
    clustered_mean,
    clustered_standard_error,
    difference,
    fixed,
    mean_estimate,
    plain_difference,
    standard_error,
    stratified_difference,
    stratified_difference_of,
    within_query_variance,
    z_half_width,
)

ndcgs = st.floats(0.0, 1.0, allow_nan=False)
# A query's cell in one arm: scored impressions and their nDCG sum (at most 1 per impression).
alphas = st.floats(1e-6, 0.5)


def parts(estimate: Estimate | None) -> list[float]:
    """An estimate's value, standard error and impressions, to compare with pytest.approx."""
    assert estimate is not None
    return [estimate.value, estimate.standard_error, estimate.impressions]


def test_the_examples_of_the_docstrings_hold() -> None:
    result = doctest.testmod(comparisons)
    assert result.attempted >= 3 and result.failed == 0


# --- the impression-level standard error


def test_the_impression_level_error_of_a_small_sample() -> None:
    # Values 0, 0.5, 1: n 3, sum 1.5, squares 1.25; mean 0.5; sample variance (1.25 - 1.5 * 0.5) / 2 = 0.25;
    # SE = sqrt(0.25 / 3) = 0.5 / sqrt(3) = 0.288675...
    estimate = mean_estimate(3, 1.5, 1.25)
    assert parts(estimate) == pytest.approx([0.5, 0.2886751346, 3])
    assert standard_error(3, 1.5, 1.25) == pytest.approx(0.2886751346)


def test_a_mean_of_alike_values_has_no_error_and_one_impression_no_estimate() -> None:
    # Four impressions of 0.5: squares 1.0 = 2.0^2 / 4, so the variance is exactly 0.
    assert mean_estimate(4, 2.0, 1.0) == Estimate(0.5, 0.0, 4)
    assert mean_estimate(1, 0.7, 0.49) is None
    assert mean_estimate(0, 0.0, 0.0) is None
    assert standard_error(0, 0.0, 0.0) is None


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40))
def test_the_impression_level_error_is_the_sample_deviation_over_root_n(values: list[float]) -> None:
    estimate = mean_estimate(len(values), math.fsum(values), math.fsum(v * v for v in values))
    assert estimate is not None
    expected = statistics.stdev(values) / math.sqrt(len(values))
    assert estimate.standard_error == pytest.approx(expected, rel=1e-6, abs=1e-7)


# --- the query-clustered standard error


def test_the_clustered_error_of_three_queries() -> None:
    # (n, s): q1 (2, 1.0), q2 (1, 0.0), q3 (1, 1.0); N = 4, m = 2 / 4 = 0.5.
    # s - m n: 1.0 - 1.0 = 0, 0.0 - 0.5 = -0.5, 1.0 - 0.5 = 0.5; squares sum to 0.5.
    # Var(m) = 3/2 * 0.5 / 4^2 = 0.046875; SE = sqrt(3) / 8 = 0.2165063...
    queries = [(2.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
    assert parts(clustered_mean(queries)) == pytest.approx([0.5, math.sqrt(3) / 8, 4.0])
    # A query with no scored impressions adds nothing and is not counted among the Q queries.
    assert clustered_standard_error([*queries, (0.0, 0.0)]) == pytest.approx(math.sqrt(3) / 8)


def test_the_clustered_error_needs_two_queries_and_is_zero_when_every_query_has_the_mean() -> None:
    assert clustered_mean([]) is None
    assert clustered_mean([(5.0, 2.0)]) is None
    assert clustered_mean([(5.0, 2.0), (0.0, 0.0)]) is None
    # Means 0.5 and 0.5: every s_q - m n_q is 0.
    assert clustered_mean([(2.0, 1.0), (4.0, 2.0)]) == Estimate(0.5, 0.0, 6.0)


@given(st.lists(ndcgs, min_size=2, max_size=40))
def test_with_one_impression_per_query_the_clustered_error_is_the_impression_level_one(values: list[float]) -> None:
    # Q/(Q-1) * sum (x - m)^2 / Q^2 = [sum (x - m)^2 / (Q - 1)] / Q: the factor Q/(Q-1) is the
    # sample variance's n/(n-1), so the two agree exactly.
    clustered = clustered_standard_error([(1.0, v) for v in values])
    plain = standard_error(len(values), math.fsum(values), math.fsum(v * v for v in values))
    assert clustered is not None and plain is not None
    assert clustered == pytest.approx(plain, rel=1e-6, abs=1e-7)


# --- the plain difference


def test_the_difference_of_two_estimates() -> None:
    # 0.45 - 0.5 = -0.05; SE sqrt(0.03^2 + 0.04^2) = 0.05; t = 100 + 120.
    result = difference(Estimate(0.5, 0.03, 100), Estimate(0.45, 0.04, 120))
    assert parts(result) == pytest.approx([-0.05, 0.05, 220])


def test_the_plain_difference_of_two_arms() -> None:
    # A: values 0, 1 (n 2, sum 1, squares 1): mean 0.5, variance (1 - 0.5) / 1 = 0.5, SE sqrt(0.5 / 2) = 0.5.
    # B: four 1s (n 4, sum 4, squares 4): mean 1, SE 0. B - A = 0.5, SE 0.5, t = 6.
    assert plain_difference((2, 1.0, 1.0), (4, 4.0, 4.0)) == Estimate(0.5, 0.5, 6)
    assert plain_difference((1, 1.0, 1.0), (4, 4.0, 4.0)) is None


# --- the stratified difference


def cell(values: list[float]) -> tuple[float, float, float]:
    """A query's (n, sum, sum of squares) in one arm."""
    return float(len(values)), math.fsum(values), math.fsum(v * v for v in values)


def cells_of(arm: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    return {query: cell(values) for query, values in arm.items()}


QUERY_IDS = [f"q{i}" for i in range(12)]
# An arm: the nDCG of each impression of each query it saw.
arms = st.dictionaries(st.sampled_from(QUERY_IDS), st.lists(ndcgs, min_size=1, max_size=8), max_size=12)

A = {"q1": [0.4, 0.6], "q2": [0.1, 0.2, 0.3], "q3": [0.9], "q4": [0.5, 0.3]}
B = {"q1": [0.6, 0.8], "q2": [0.2], "q3": [0.8], "q5": [0.5, 0.5]}


def test_the_stratified_difference_of_three_queries_in_common() -> None:
    # In common: q1, q2, q3 (q4 only in A, q5 only in B).
    # Means A 0.5, 0.2, 0.9; B 0.7, 0.2, 0.8. d = 0.2, 0, -0.1; u = 4, 4, 2; w = 0.4, 0.4, 0.2;
    # D = 0.4 * 0.2 + 0.4 * 0 + 0.2 * -0.1 = 0.06; t = 10.
    # Within-query squares of A: q1 0.02, q2 0.02, q3 0, q4 0.02 = 0.06 over 8 impressions - 4 queries: v_A = 0.015;
    # of B: q1 0.02, q2 0, q3 0, q5 0 = 0.02 over 6 - 4: v_B = 0.01.
    # sum u^2 / n_A = 16/2 + 16/3 + 4/1 = 17.3333; sum u^2 / n_B = 16/2 + 16/1 + 4/1 = 28.
    # Var(D) = (0.015 * 17.3333 + 0.01 * 28) / 10^2 = (0.26 + 0.28) / 100 = 0.0054; SE = 0.0734847.
    result = stratified_difference_of(cells_of(A), cells_of(B))
    assert parts(result) == pytest.approx([0.06, math.sqrt(0.0054), 10.0])


def test_the_stratified_difference_needs_a_query_in_common_and_a_within_query_variance() -> None:
    assert stratified_difference_of({}, {}) is None
    assert stratified_difference(StratifiedSums()) is None
    assert stratified_difference_of(cells_of({"q1": [0.2, 0.4]}), cells_of({"q2": [0.1, 0.5]})) is None
    # A query an arm holds with no scored impressions is not seen by it.
    assert stratified_difference_of({**cells_of({"q1": [0.2, 0.4]}), "q2": (0.0, 0.0, 0.0)},
                                    cells_of({"q2": [0.1, 0.5]})) is None
    # B saw each of its queries once: no within-query variance to pool.
    assert stratified_difference_of(cells_of({"q1": [0.2, 0.4], "q2": [0.3]}), cells_of({"q1": [0.1], "q2": [0.5]})) \
        is None
    # One query in common is enough when each arm saw a query twice.
    assert stratified_difference_of(cells_of({"q1": [0.2, 0.4]}), cells_of({"q1": [0.1, 0.5]})) is not None


def test_alike_values_within_each_query_give_no_error() -> None:
    # Every query's values alike in each arm: v_A = v_B = 0, whatever the differences between queries.
    result = stratified_difference_of(cells_of({"q1": [0.5, 0.5], "q2": [0.25]}), cells_of({"q1": [0.75, 0.75],
                                                                                           "q2": [0.5, 0.5]}))
    # d = 0.25, 0.25 with u = 4, 3: D = 0.25, SE 0.
    assert parts(result) == pytest.approx([0.25, 0.0, 7.0])


@given(arms)
def test_the_stratified_difference_of_identical_arms_is_zero(arm: dict[str, list[float]]) -> None:
    result = stratified_difference_of(cells_of(arm), cells_of(arm))
    assume(result is not None)
    assert result is not None and result.value == 0.0


@given(arms, arms)
def test_swapping_the_arms_negates_the_stratified_difference(a: dict[str, list[float]],
                                                            b: dict[str, list[float]]) -> None:
    forward, backward = stratified_difference_of(cells_of(a), cells_of(b)), stratified_difference_of(cells_of(b),
                                                                                                      cells_of(a))
    assert (forward is None) == (backward is None)
    if forward is not None and backward is not None:
        assert backward.value == pytest.approx(-forward.value, abs=1e-12)
        assert backward.standard_error == pytest.approx(forward.standard_error, rel=1e-9, abs=1e-12)


@given(st.lists(ndcgs, min_size=2, max_size=30), st.lists(ndcgs, min_size=2, max_size=30))
def test_with_one_query_it_is_the_plain_difference(a: list[float], b: list[float]) -> None:
    # One stratum: D is the difference of the means, and v_X / n_X each arm's squared standard error.
    stratified = stratified_difference_of({"q": cell(a)}, {"q": cell(b)})
    plain = plain_difference(cell(a), cell(b))
    assert parts(stratified) == pytest.approx(parts(plain), rel=1e-6, abs=1e-9)


@given(arms, arms)
def test_the_pooled_variance_is_the_spread_around_each_querys_mean(a: dict[str, list[float]],
                                                                   b: dict[str, list[float]]) -> None:
    sums = StratifiedSums.of(cells_of(a), cells_of(b))
    for arm, impressions, queries, within in ((a, sums.impressions_a, sums.queries_a, sums.within_a),
                                              (b, sums.impressions_b, sums.queries_b, sums.within_b)):
        spread = math.fsum((v - statistics.fmean(values)) ** 2 for values in arm.values() for v in values)
        count = sum(len(values) for values in arm.values())
        assert (impressions, queries) == (count, len(arm))
        found = within_query_variance(impressions, queries, within)
        if count - len(arm) < 1:
            assert found is None
        else:
            assert found == pytest.approx(spread / (count - len(arm)), rel=1e-6, abs=1e-9)


@given(arms, arms, st.lists(st.tuples(st.sampled_from(QUERY_IDS), st.booleans(), st.lists(ndcgs, max_size=8))))
def test_running_sums_moved_query_by_query_equal_the_sums_afresh(
    a: dict[str, list[float]], b: dict[str, list[float]], changes: list[tuple[str, bool, list[float]]]
) -> None:
    # How a running comparison keeps them: a changed query's old term out, its new one in.
    empty = (0.0, 0.0, 0.0)
    cells_a, cells_b = cells_of(a), cells_of(b)
    running = [0.0] * len(astuple(StratifiedSums()))
    for query in cells_a.keys() | cells_b.keys():
        running = [x + y for x, y in zip(running, StratifiedSums.term(cells_a.get(query, empty),
                                                                      cells_b.get(query, empty)), strict=True)]
    for query, in_b, values in changes:
        old = StratifiedSums.term(cells_a.get(query, empty), cells_b.get(query, empty))
        (cells_b if in_b else cells_a)[query] = cell(values)
        new = StratifiedSums.term(cells_a.get(query, empty), cells_b.get(query, empty))
        running = [x - y + z for x, y, z in zip(running, old, new, strict=True)]
    afresh = StratifiedSums.of({q: c for q, c in cells_a.items() if c[0]}, {q: c for q, c in cells_b.items() if c[0]})
    assert astuple(StratifiedSums.from_sums(running)) == pytest.approx(astuple(afresh), rel=1e-9, abs=1e-9)


# --- the intervals


def test_the_always_valid_half_width_at_n_star() -> None:
    # alpha 0.05, N* 10,000, SE 0.01, t 10,000: s = 0.01 * 100 = 1.
    # -2 ln 0.05 = 5.991465; ln(5.991465 + 1) = 1.944691; rho^2 = 7.936156 / 10,000; t rho^2 = 7.936156.
    # 2 (8.936156) / (10^8 * 7.936156e-4) = 17.872312 / 79361.56 = 2.251996e-4;
    # ln(sqrt(8.936156) / 0.05) = ln(2.989340 / 0.05) = ln(59.78680) = 4.090786;
    # half-width = sqrt(2.251996e-4 * 4.090786) = sqrt(9.212436e-4) = 0.0303520.
    assert always_valid_half_width(0.01, 10_000) == pytest.approx(0.0303520, rel=1e-5)
    # At t = 100 and the same s (SE 0.1): t rho^2 = 0.07936156;
    # 2 (1.07936156) / (10^4 * 7.936156e-4) = 2.15872312 / 7.936156 = 0.272011;
    # ln(sqrt(1.07936156) / 0.05) = ln(1.038923 / 0.05) = ln(20.77846) = 3.033918;
    # half-width = 1 * sqrt(0.272011 * 3.033918) = sqrt(0.825259) = 0.908438.
    assert always_valid_half_width(0.1, 100) == pytest.approx(0.908438, rel=1e-5)


def test_the_fixed_half_width() -> None:
    # z(0.975) = 1.959964.
    assert z_half_width(0.01) == pytest.approx(0.01959964, rel=1e-6)


def test_the_intervals_and_the_decision() -> None:
    estimate = Estimate(-0.05, 0.01, 10_000)
    # Fixed: -0.05 +- 0.0196 excludes 0; always-valid: -0.05 +- 0.0303520 too.
    assert fixed(estimate).decided and fixed(estimate).high == pytest.approx(-0.0304004, rel=1e-5)
    valid = always_valid(estimate)
    assert valid.decided and [valid.low, valid.high] == pytest.approx([-0.080352, -0.019648], rel=1e-4)
    # -0.025 +- 0.0303520 holds 0: not yet decided, though the fixed interval (+- 0.0196) would say so.
    assert fixed(Estimate(-0.025, 0.01, 10_000)).decided
    assert not always_valid(Estimate(-0.025, 0.01, 10_000)).decided
    assert Comparison(0.1, 0.02, 0.05, 0.15).decided and not Comparison(0.0, 0.02, -0.04, 0.04).decided


def test_a_zero_error_gives_an_interval_without_width() -> None:
    assert always_valid(Estimate(0.1, 0.0, 10)) == Comparison(0.1, 0.0, 0.1, 0.1)
    assert always_valid(Estimate(0.1, 0.0, 10)).decided
    assert not always_valid(Estimate(0.0, 0.0, 10)).decided


def test_impossible_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="impressions"):
        always_valid_half_width(0.01, 0)
    for alpha in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="alpha"):
            always_valid_half_width(0.01, 100, alpha=alpha)
    with pytest.raises(ValueError, match="N\\*"):
        always_valid_half_width(0.01, 100, n_star=0)


@given(st.floats(0.01, 1.0), st.floats(1.0, 1e7), st.floats(1.0001, 100.0), alphas, st.floats(10.0, 1e6))
def test_the_always_valid_interval_shrinks_as_impressions_come(
    deviation: float, t: float, factor: float, alpha: float, n_star: float
) -> None:
    # The same per-impression deviation s: SE = s / sqrt(t).
    def half(t: float) -> float:
        return always_valid_half_width(deviation / math.sqrt(t), t, alpha, n_star)

    assert half(t * factor) < half(t)


@given(st.floats(1e-6, 1.0), st.floats(1.0, 1e9), alphas, st.floats(1.0, 1e7))
def test_the_always_valid_interval_is_wider_than_the_fixed_one(se: float, t: float, alpha: float,
                                                              n_star: float) -> None:
    assert always_valid_half_width(se, t, alpha, n_star) > z_half_width(se, alpha)


# --- a named control


def test_alpha_is_split_among_the_comparisons_with_the_control() -> None:
    assert bonferroni(0.05, 2) == 0.05
    assert bonferroni(0.05, 3) == 0.025
    assert bonferroni(0.05, 5) == 0.0125
    with pytest.raises(ValueError, match="control"):
        bonferroni(0.05, 1)


def test_every_arm_is_compared_with_the_control() -> None:
    arms = {"A": (400, 240.0, 160.0), "B": (380, 209.0, 130.0), "C": (390, 180.0, 100.0), "D": (1, 0.5, 0.25)}
    results = against_control(arms, "A", plain_difference)
    assert set(results) == {"B", "C", "D"} and results["D"] is None
    # Four arms, three comparisons: each at 0.05 / 3.
    for arm in ("B", "C"):
        estimate = plain_difference(arms["A"], arms[arm])
        assert estimate is not None and results[arm] == always_valid(estimate, 0.05 / 3)
    with pytest.raises(KeyError, match="control"):
        against_control(arms, "Z", plain_difference)
