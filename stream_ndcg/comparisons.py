"""Comparisons of nDCG means with an error that holds while a team watches them.

Pure, standard library only. Each statistic is declared once here, from sums a store can keep:
an arm's impressions as (n, sum, sum of squares) of per-impression nDCG, a query's as (n_q, s_q)
or (n_q, s_q, ss_q).

    a = mean_estimate(n=400, total=240.0, squares=160.0)     # the control, A
    b = mean_estimate(n=380, total=209.0, squares=130.0)
    result = always_valid(difference(a, b))                   # B - A, its error and interval
    result.decided                                            # False: the interval holds 0

The statistics:

- `mean_estimate`: a mean with its impression-level standard error, sqrt(v / n) with v the sample
  variance (squares - total^2 / n) / (n - 1), 0 where squares - total^2 / n is within the
  rounding of the sums (n * 2^-50 of the squares). None under 2 impressions.
- `clustered_mean`: a mean with its query-clustered standard error, for comparing a window with
  an earlier one (whose query mix differs): m = sum s_q / sum n_q and
  Var(m) = Q/(Q-1) * sum_q (s_q - m n_q)^2 / (sum_q n_q)^2 over the Q queries with impressions.
  None under 2 queries.
- `query_mean`: the query-averaged mean, each query's mean s_q / n_q averaged over the queries.
- `difference`: B - A of two independent estimates, SE = sqrt(SE_A^2 + SE_B^2) (the plain
  difference when both are `mean_estimate`s).
- `stratified_difference`: B vs A within each query, from each arm's per-query (n_q, s_q, ss_q)
  (ss: the sum of squares). Over the queries both arms saw, with d_q = s_B,q / n_B,q - s_A,q / n_A,q
  and traffic weights w_q = u_q / sum u, u_q = n_A,q + n_B,q: D = sum_q w_q d_q and
  Var(D) = sum_q w_q^2 (v_A / n_A,q + v_B / n_B,q), v_X being arm X's within-query variance pooled
  over all its Q_X queries and N_X impressions, sum_q (ss_q - s_q^2 / n_q) / (N_X - Q_X): the
  post-stratification variance, queries as fixed strata. Pooling gives it N_X - Q_X degrees of
  freedom; a query-clustered variance of D has a few dozen at most (the head queries carry most of
  the weight), and its noise lets an interval watched every minute cross 0 more often than alpha
  allows. A query whose variance differs from the pool's counts by its traffic both in v_X and in
  Var(D), so the differences average out alike. Like the impression-level error, it takes the
  impressions of a query in one arm as independent. None when the arms have no query in common,
  or an arm saw no query twice (no within-query variance). `StratifiedSums` keeps it running.
- `fixed`: the interval +- z(1 - alpha/2) SE, valid for one look only.
- `always_valid`: the asymptotic confidence sequence (Waudby-Smith et al., in GrowthBook's form),
  valid however often it is looked at when the estimate is anchored at a start: with
  t = n_A + n_B, s^2 = SE^2 t and rho^2 = (-2 ln alpha + ln(-2 ln alpha + 1)) / N*, the half-width
  is s * sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * ln(sqrt(t rho^2 + 1) / alpha)). N* is the number of
  impressions at which a team expects to decide: the interval is narrowest near it.
- `against_control`: every other arm against a named control, each at alpha / (arms - 1)
  (Bonferroni: the chance that any of the comparisons errs stays under alpha).

A `Comparison` is the difference, its standard error, the interval and whether the interval
excludes 0 (`decided`). A zero standard error (every impression of each arm scored alike) is an
estimate like any other: its interval has no width, decided unless the difference is 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from statistics import NormalDist
from typing import TypeVar

ALPHA = 0.05
N_STAR = 10_000
# The relative rounding of one term of a sum (2**-52 and a margin): what `mean_estimate` takes
# for noise in a spread.
ROUNDING = 2.0**-50

# A query's scored impressions and nDCG sum (the drill-down's per-query sums).
QuerySums = tuple[float, float]
# A query's scored impressions, nDCG sum and sum of squares, in one arm.
Cell = tuple[float, float, float]
T = TypeVar("T")


@dataclass(frozen=True)
class Estimate:
    """A mean or a difference of means, its standard error, and the impressions behind it (the t
    of the always-valid interval)."""

    value: float
    standard_error: float
    impressions: float


@dataclass(frozen=True)
class Comparison:
    """B - A with its standard error and interval; `decided` once the interval excludes 0.

        >>> c = fixed(Estimate(value=-0.03, standard_error=0.01, impressions=5000))
        >>> c.decided, round(c.low, 4), round(c.high, 4)
        (True, -0.0496, -0.0104)
    """

    difference: float
    standard_error: float
    low: float
    high: float

    @property
    def decided(self) -> bool:
        return self.low > 0 or self.high < 0


def mean_estimate(n: float, total: float, squares: float) -> Estimate | None:
    """The mean of n per-impression values with its impression-level standard error, from their
    sum and sum of squares; None under 2 impressions (no variance to estimate)."""
    if n < 2:
        return None
    mean = total / n
    spread = beyond_rounding(squares - total * mean, n, squares)
    return Estimate(mean, math.sqrt(spread / (n - 1) / n), n)


def beyond_rounding(spread: float, n: float, squares: float) -> float:
    """A sum of squares less its part explained by a mean, or 0 within the rounding of the n
    terms of `squares`: values all alike leave the difference that little (below 0 even), which
    a square root would make an error of 1e-8."""
    return 0.0 if spread <= n * ROUNDING * squares else spread


def standard_error(n: float, total: float, squares: float) -> float | None:
    """The impression-level standard error of a mean (`mean_estimate`); None under 2 impressions."""
    estimate = mean_estimate(n, total, squares)
    return None if estimate is None else estimate.standard_error


def clustered_mean(queries: Iterable[QuerySums]) -> Estimate | None:
    """The impression-weighted mean over queries' (n_q, s_q) with its query-clustered standard
    error; queries without impressions do not count, and under 2 queries it is None."""
    cells = [(n, s) for n, s in queries if n > 0]
    count = len(cells)
    if count < 2:
        return None
    impressions = math.fsum(n for n, _ in cells)
    mean = math.fsum(s for _, s in cells) / impressions
    spread = math.fsum((s - mean * n) ** 2 for n, s in cells)
    return Estimate(mean, math.sqrt(count / (count - 1) * spread) / impressions, impressions)


def clustered_standard_error(queries: Iterable[QuerySums]) -> float | None:
    """The query-clustered standard error of a mean (`clustered_mean`); None under 2 queries."""
    estimate = clustered_mean(queries)
    return None if estimate is None else estimate.standard_error


def query_mean(queries: Iterable[QuerySums]) -> float | None:
    """The mean over queries of each query's own mean (trec_eval's mean over topics: each query
    counts once, whatever its traffic), over (n_q, s_q); queries without impressions do not
    count, and without any it is None."""
    means = [s / n for n, s in queries if n > 0]
    return math.fsum(means) / len(means) if means else None


def difference(a: Estimate, b: Estimate) -> Estimate:
    """B - A of two independent estimates (two arms, or a window and an earlier one)."""
    return Estimate(b.value - a.value, math.hypot(a.standard_error, b.standard_error), a.impressions + b.impressions)


def plain_difference(a: tuple[float, float, float], b: tuple[float, float, float]) -> Estimate | None:
    """B - A of two arms given as (n, sum, sum of squares); None if either has under 2 impressions."""
    mean_a, mean_b = mean_estimate(*a), mean_estimate(*b)
    return None if mean_a is None or mean_b is None else difference(mean_a, mean_b)


@dataclass(frozen=True)
class StratifiedSums:
    """What the stratified difference needs of two arms' queries, as sums over queries: sums add
    up, so a running comparison moves them by the queries that changed (take a query's old `term`
    out, put its new one in) instead of reading every query again. With u_q = n_A,q + n_B,q and
    d_q the difference of the query's means, over the queries both arms saw:

        >>> a = {"q1": (2, 1.0, 0.52), "q2": (1, 0.2, 0.04)}
        >>> b = {"q1": (2, 1.2, 0.74), "q2": (3, 0.9, 0.29)}
        >>> round(stratified_difference(StratifiedSums.of(a, b)).value, 4)
        0.1
    """

    queries: int = 0  # queries both arms saw
    weight: float = 0.0  # sum u_q
    weighted: float = 0.0  # sum u_q d_q
    spread_a: float = 0.0  # sum u_q^2 / n_A,q
    spread_b: float = 0.0  # sum u_q^2 / n_B,q
    # Per arm, over every query it saw: impressions, queries, and sum (ss_q - s_q^2 / n_q).
    impressions_a: float = 0.0
    queries_a: int = 0
    within_a: float = 0.0
    impressions_b: float = 0.0
    queries_b: int = 0
    within_b: float = 0.0

    @staticmethod
    def term(a: Cell, b: Cell) -> tuple[float, ...]:
        """One query's part of each sum, in field order (a cell with no impressions: not seen)."""
        (n_a, s_a, ss_a), (n_b, s_b, ss_b) = a, b
        seen_a, seen_b = n_a > 0, n_b > 0
        within_a = beyond_rounding(ss_a - s_a * s_a / n_a, n_a, ss_a) if seen_a else 0.0
        within_b = beyond_rounding(ss_b - s_b * s_b / n_b, n_b, ss_b) if seen_b else 0.0
        arms = (n_a, float(seen_a), within_a, n_b, float(seen_b), within_b)
        if not (seen_a and seen_b):
            return (0.0, 0.0, 0.0, 0.0, 0.0, *arms)
        u = n_a + n_b
        return (1.0, u, u * (s_b / n_b - s_a / n_a), u * u / n_a, u * u / n_b, *arms)

    @classmethod
    def of(cls, a: Mapping[str, Cell], b: Mapping[str, Cell]) -> StratifiedSums:
        """The sums over two arms' per-query (n_q, s_q, ss_q)."""
        empty = (0.0, 0.0, 0.0)
        terms = [cls.term(a.get(query, empty), b.get(query, empty)) for query in a.keys() | b.keys()]
        sums = [math.fsum(term[i] for term in terms) for i in range(len(fields(cls)))]
        return cls.from_sums(sums)

    @classmethod
    def from_sums(cls, sums: Sequence[float]) -> StratifiedSums:
        """The sums in field order, as `term`s add up (counts given as floats)."""
        queries, weight, weighted, spread_a, spread_b, n_a, queries_a, within_a, n_b, queries_b, within_b = sums
        return cls(round(queries), weight, weighted, spread_a, spread_b, n_a, round(queries_a), within_a,
                   n_b, round(queries_b), within_b)


def within_query_variance(impressions: float, queries: int, within: float) -> float | None:
    """An arm's pooled within-query variance, sum_q (ss_q - s_q^2 / n_q) / (N - Q); None without
    a degree of freedom (no query seen twice)."""
    if impressions - queries < 1:
        return None
    # Each query's part is exact; their sum may round below 0 when every query's values are alike.
    return max(0.0, within) / (impressions - queries)


def stratified_difference(sums: StratifiedSums) -> Estimate | None:
    """B - A as the traffic-weighted mean of per-query differences, with its standard error from
    the arms' pooled within-query variances (module docstring); None without a query in common or
    without a within-query variance."""
    if sums.queries < 1:
        return None
    variance_a = within_query_variance(sums.impressions_a, sums.queries_a, sums.within_a)
    variance_b = within_query_variance(sums.impressions_b, sums.queries_b, sums.within_b)
    if variance_a is None or variance_b is None:
        return None
    variance = variance_a * sums.spread_a + variance_b * sums.spread_b
    return Estimate(sums.weighted / sums.weight, math.sqrt(variance) / sums.weight, sums.weight)


def stratified_difference_of(a: Mapping[str, Cell], b: Mapping[str, Cell]) -> Estimate | None:
    """`stratified_difference` of two arms' per-query (n_q, s_q, ss_q) (query id -> cell)."""
    return stratified_difference(StratifiedSums.of(a, b))


def _check(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")


def z_half_width(standard_error: float, alpha: float = ALPHA) -> float:
    """The half-width of the fixed two-sided interval: z(1 - alpha/2) standard errors."""
    _check(alpha)
    return NormalDist().inv_cdf(1 - alpha / 2) * standard_error


@functools.lru_cache(maxsize=64)
def rho_squared(alpha: float = ALPHA, n_star: float = N_STAR) -> float:
    """The confidence sequence's tuning, chosen so that it is narrowest near N* impressions."""
    _check(alpha)
    if n_star <= 0:
        raise ValueError(f"N* must be positive, not {n_star}")
    return (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / n_star


def always_valid_half_width(
    standard_error: float, impressions: float, alpha: float = ALPHA, n_star: float = N_STAR
) -> float:
    """The half-width of the asymptotic confidence sequence at t = `impressions` (module docstring).
    Raises ValueError for t <= 0: an estimate with no impressions does not exist (`mean_estimate`)."""
    if impressions <= 0:
        raise ValueError(f"an interval needs impressions, not {impressions}")
    rho2 = rho_squared(alpha, n_star)
    t = impressions
    s = standard_error * math.sqrt(t)
    return s * math.sqrt(2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))


def fixed(estimate: Estimate, alpha: float = ALPHA) -> Comparison:
    """The comparison with the fixed z interval: what one look at a planned sample size may use."""
    half = z_half_width(estimate.standard_error, alpha)
    return Comparison(estimate.value, estimate.standard_error, estimate.value - half, estimate.value + half)


def always_valid(estimate: Estimate, alpha: float = ALPHA, n_star: float = N_STAR) -> Comparison:
    """The comparison with the always-valid interval: the chance that it ever excludes the true
    difference, looked at after every impression, stays under alpha (asymptotically)."""
    half = always_valid_half_width(estimate.standard_error, estimate.impressions, alpha, n_star)
    return Comparison(estimate.value, estimate.standard_error, estimate.value - half, estimate.value + half)


def bonferroni(alpha: float, arms: int) -> float:
    """The alpha of each comparison when `arms` arms (the control among them) are each compared
    with the control: alpha / (arms - 1)."""
    _check(alpha)
    if arms < 2:
        raise ValueError(f"a comparison needs a control and another arm, not {arms} arm(s)")
    return alpha / (arms - 1)


def against_control(
    arms: Mapping[str, T],
    control: str,
    compare: Callable[[T, T], Estimate | None],
    alpha: float = ALPHA,
    n_star: float = N_STAR,
) -> dict[str, Comparison | None]:
    """Every arm but `control` against it (`compare(control's data, the arm's)`, e.g.
    `plain_difference`), each with the always-valid interval at the Bonferroni share of alpha;
    None for an arm with too little data to compare.

        >>> arms = {"A": (400, 240.0, 160.0), "B": (380, 209.0, 130.0), "C": (390, 180.0, 100.0)}
        >>> {arm: c.decided for arm, c in against_control(arms, "A", plain_difference).items()}
        {'B': False, 'C': True}
    """
    if control not in arms:
        raise KeyError(f"the control {control!r} is not among the arms {sorted(arms)}")
    each = bonferroni(alpha, len(arms))
    results: dict[str, Comparison | None] = {}
    for arm, data in arms.items():
        if arm != control:
            estimate = compare(arms[control], data)
            results[arm] = None if estimate is None else always_valid(estimate, each, n_star)
    return results
