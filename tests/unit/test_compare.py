"""Comparisons with a named control: the stratified difference from the arms' sums of squares
equals the one from each query's own, and alpha is split among the comparisons."""

from __future__ import annotations

import math
import random

import pytest

from stream_ndcg.comparisons import always_valid, bonferroni, plain_difference, stratified_difference_of
from stream_ndcg.drilldown.compare import Arm, against


def arm_of(values: dict[str, list[float]]) -> tuple[Arm, dict[str, tuple[float, float, float]]]:
    """An arm from per-query values, and its cells with each query's own sum of squares."""
    cells = {q: (float(len(v)), math.fsum(v), math.fsum(x * x for x in v)) for q, v in values.items()}
    totals = tuple(math.fsum(cell[i] for cell in cells.values()) for i in range(3))
    return Arm((totals[0], totals[1], totals[2]), {q: (n, s) for q, (n, s, _) in cells.items()}), cells


def test_three_arms_each_against_the_control_at_half_alpha_stratified_as_with_each_querys_squares() -> None:
    rnd = random.Random(29)
    queries = [f"q{i}" for i in range(30)]
    drawn = {arm: {q: [min(1.0, max(0.0, rnd.gauss(0.3 + 0.01 * i + shift, 0.2))) for _ in range(rnd.randint(1, 9))]
                   for i, q in enumerate(queries) if rnd.random() < 0.9}
             for arm, shift in (("A", 0.0), ("B", -0.05), ("C", 0.0))}
    arms, cells = {}, {}
    for name, values in drawn.items():
        arms[name], cells[name] = arm_of(values)
    result = against(arms, "A", alpha=0.05, n_star=10_000)
    assert result["alpha_each"] == bonferroni(0.05, 3) == 0.025
    assert set(result["arms"]) == {"B", "C"}
    for name in ("B", "C"):
        stratified = stratified_difference_of(cells["A"], cells[name])
        control_totals, arm_totals = arms["A"].totals, arms[name].totals
        assert stratified is not None and control_totals is not None and arm_totals is not None
        plain = plain_difference(control_totals, arm_totals)
        assert plain is not None
        expected = {"stratified": always_valid(stratified, 0.025), "plain": always_valid(plain, 0.025)}
        for kind, comparison in expected.items():
            got = result["arms"][name][kind]
            assert got["difference"] == pytest.approx(comparison.difference, abs=1e-12)
            assert got["standard_error"] == pytest.approx(comparison.standard_error, rel=1e-9)
            assert (got["low"], got["high"]) == pytest.approx((comparison.low, comparison.high), rel=1e-9)
            assert got["excludes_zero"] == comparison.decided


def test_without_the_control_or_its_squares_nothing_is_compared() -> None:
    arm, _ = arm_of({"q1": [0.5, 0.7], "q2": [0.1, 0.2]})
    assert against({"B": arm}, "A", 0.05, 10_000)["arms"] == {"B": {"plain": None, "stratified": None}}
    assert against({"A": arm}, "A", 0.05, 10_000)["arms"] == {}
    assert against({"A": arm, "B": arm, "C": arm}, "D", 0.05, 10_000)["arms"] == {
        "A": {"plain": None, "stratified": None}, "B": {"plain": None, "stratified": None},
        "C": {"plain": None, "stratified": None}}
    unknown = Arm(None, arm.queries)
    assert against({"A": arm, "B": unknown}, "A", 0.05, 10_000)["arms"] == {"B": {"plain": None, "stratified": None}}
