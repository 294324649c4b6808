"""Every value of a segment label compared with a named control, as the API and the replay report it.

Pure, standard library only; the statistics are `comparisons`'. An arm is one value of the
control's label: its scored impressions, nDCG sum and sum of squares at a cut-off (None where
the squares do not hold every impression) and its queries' (n_q, s_q). Each other arm is
compared with the control twice, each time with its standard error and always-valid interval
at alpha / (arms - 1) (Bonferroni: the chance that any comparison errs stays under alpha):

- plain: the difference of the arms' means, errors from each arm's sums of squares;
- stratified: the traffic-weighted mean of per-query differences over the queries both arms
  saw (`comparisons.stratified_difference`). Its within-query variance needs
  sum_q (ss_q - s_q^2 / n_q) per arm, which is the arm's sum of squares less sum_q s_q^2 / n_q:
  no query's own sum of squares is needed.

    arms = {"A": Arm((400.0, 240.0, 160.0), {...}), "B": Arm((380.0, 209.0, 130.0), {...})}
    against(arms, "A", alpha=0.05, n_star=10_000)   # {"alpha_each": 0.05, "arms": {"B": {...}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from stream_ndcg.comparisons import (
    Comparison,
    Estimate,
    StratifiedSums,
    against_control,
    beyond_rounding,
    bonferroni,
    plain_difference,
    stratified_difference,
)
from stream_ndcg.rows import NDCG, SCORED, row_index
from stream_ndcg.vocabulary import IMPRESSIONS, MOMENTS, ndcg_at, ndcg_squares_at, scored_at

# The correction of alpha with more than two arms, as reported.
CORRECTION = "bonferroni: alpha / (arms - 1) for each comparison with the control"


class Arm(NamedTuple):
    """One value of the control's label at one cut-off."""

    # (scored impressions, nDCG sum, sum of squares); None while the squares miss impressions.
    totals: tuple[float, float, float] | None
    # query -> (scored impressions, nDCG sum)
    queries: Mapping[str, tuple[float, float]]


def plain(control: Arm, arm: Arm) -> Estimate | None:
    """The arm's mean less the control's, with the impression-level errors."""
    if control.totals is None or arm.totals is None:
        return None
    return plain_difference(control.totals, arm.totals)


def stratified(control: Arm, arm: Arm) -> Estimate | None:
    """The traffic-weighted mean of the per-query differences, arm less control."""
    if control.totals is None or arm.totals is None:
        return None
    # Each query's cell with the sum of squares its mean alone explains (s_q^2 / n_q): its part of
    # the within-query sum is 0, and the arm's sum of squares less theirs is the whole of it.
    sums = StratifiedSums.of({q: (n, s, s * s / n if n else 0.0) for q, (n, s) in control.queries.items()},
                             {q: (n, s, s * s / n if n else 0.0) for q, (n, s) in arm.queries.items()})
    return stratified_difference(replace(sums, within_a=_within(control.totals, control.queries),
                                         within_b=_within(arm.totals, arm.queries)))


def _within(totals: tuple[float, float, float], queries: Mapping[str, tuple[float, float]]) -> float:
    """sum_q (ss_q - s_q^2 / n_q) over an arm's queries: its sum of squares less sum_q s_q^2 / n_q."""
    n, _, squares = totals
    explained = math.fsum(s * s / count for count, s in queries.values() if count)
    return beyond_rounding(squares - explained, n, squares)


def against(arms: Mapping[str, Arm], control: str, alpha: float, n_star: float) -> dict[str, Any]:
    """Every arm but `control` against it: per arm its plain and stratified comparison (None
    where an arm has too little to compare), at the Bonferroni share of alpha."""
    others = [value for value in arms if value != control]
    # Without the control in the window (or without another arm) nothing is compared.
    compared = bool(others) and control in arms
    plain_results = against_control(arms, control, plain, alpha, n_star) if compared else {}
    stratified_results = against_control(arms, control, stratified, alpha, n_star) if compared else {}
    return {
        "alpha": alpha, "alpha_each": bonferroni(alpha, len(others) + 1) if others else alpha,
        "correction": CORRECTION, "n_star": n_star,
        "arms": {value: {"plain": shown(plain_results.get(value)), "stratified": shown(stratified_results.get(value))}
                 for value in others},
    }


def with_control(control: tuple[str, str], cutoffs: Sequence[int], arms: Sequence[Mapping[str, Arm]],
                 alpha: float, n_star: float) -> dict[str, Any]:
    """The summary's `comparisons`: the control (label, value), and per cut-off (`arms[i]` at
    `cutoffs[i]`) every other value of its label against it (`against`)."""
    label, value = control
    return {"control": {"label": label, "value": value},
            "k": {str(k): against(arms[i], value, alpha, n_star) for i, k in enumerate(cutoffs)}}


def arms_at(totals: Mapping[tuple[str, ...], Mapping[str, float]], at: int,
            tables: Mapping[str, Mapping[str, Sequence[float]]], cutoff_index: int, k: int) -> dict[str, Arm]:
    """The arms at one cut-off, from a window's totals per segment values (those with value v at
    position `at` make arm v) and each arm's drill-down rows per query (`tables`, value -> query ->
    summed row)."""
    summed: dict[str, dict[str, float]] = {}
    for values, sums in totals.items():
        into = summed.setdefault(values[at], {})
        for name in (IMPRESSIONS, MOMENTS, scored_at(k), ndcg_at(k), ndcg_squares_at(k)):
            into[name] = into.get(name, 0.0) + sums.get(name, 0.0)
    scored, ndcg = row_index(cutoff_index, SCORED), row_index(cutoff_index, NDCG)
    return {value: Arm((sums[scored_at(k)], sums[ndcg_at(k)], sums[ndcg_squares_at(k)])
                       if sums[MOMENTS] == sums[IMPRESSIONS] else None,
                       {query: (row[scored], row[ndcg]) for query, row in tables.get(value, {}).items()})
            for value, sums in summed.items()}


def shown(comparison: Comparison | None) -> dict[str, Any] | None:
    """A comparison as the API and the replay give it."""
    if comparison is None:
        return None
    return {"difference": comparison.difference, "standard_error": comparison.standard_error,
            "low": comparison.low, "high": comparison.high, "excludes_zero": comparison.decided}
