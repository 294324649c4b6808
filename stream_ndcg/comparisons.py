"""Comparisons of nDCG means with an error that holds while a team watches them.

Pure, standard library only. Each statistic is declared once here, from sums a store can keep:
an arm's impressions as (n, sum, sum of squares) of per-impression nDCG, a query's as (n_q, s_q).

    a = mean_estimate(n=400, total=240.0, squares=160.0)     # the control, A
    b = mean_estimate(n=380, total=209.0, squares=130.0)
    result = always_valid(difference(a, b))                   # B - A, its error and interval
    result.decided                                            # False: the interval holds 0

The statistics:

- `mean_estimate`: a mean with its impression-level standard error, sqrt(v / n) with v the sample
  variance (squares - total^2 / n) / (n - 1). None under 2 impressions.
- `clustered_mean`: a mean with its query-clustered standard error, for comparing a window with
  an earlier one (whose query mix differs): m = sum s_q / sum n_q and
  Var(m) = Q/(Q-1) * sum_q (s_q - m n_q)^2 / (sum_q n_q)^2 over the Q queries with impressions.
  None under 2 queries.
- `difference`: B - A of two independent estimates, SE = sqrt(SE_A^2 + SE_B^2) (the plain
  difference when both are `mean_estimate`s).
- `stratified_difference`: B vs A within each query. Over the queries both arms saw, with
  d_q = s_B,q / n_B,q - s_A,q / n_A,q and traffic weights w_q = u_q / sum u with u_q = n_A,q + n_B,q,
  D = sum_q w_q d_q and Var(D) = sum_q w_q^2 (d_q - D)^2 / (1 - sum_q w_q^2): the query-clustered
  variance of a weighted mean. Its factor 1 / (1 - sum w_q^2) is Q/(Q-1) when the weights are
  equal, and makes it unbiased when each d_q's variance is inversely proportional to its traffic
  (a 50/50 split); per-query effects that differ only widen it. None under 2 queries in common.
  It needs the per-query sums alone, which `StratifiedSums` reduces to five running sums.
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import TypeVar

ALPHA = 0.05
N_STAR = 10_000

# A query's scored impressions and nDCG sum, in one arm.
Cell = tuple[float, float]
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
    # The sums are exact per impression; their difference may round below 0 when every value is alike.
    variance = max(0.0, (squares - total * mean) / (n - 1))
    return Estimate(mean, math.sqrt(variance / n), n)


def standard_error(n: float, total: float, squares: float) -> float | None:
    """The impression-level standard error of a mean (`mean_estimate`); None under 2 impressions."""
    estimate = mean_estimate(n, total, squares)
    return None if estimate is None else estimate.standard_error


def clustered_mean(queries: Iterable[Cell]) -> Estimate | None:
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


def clustered_standard_error(queries: Iterable[Cell]) -> float | None:
    """The query-clustered standard error of a mean (`clustered_mean`); None under 2 queries."""
    estimate = clustered_mean(queries)
    return None if estimate is None else estimate.standard_error


def difference(a: Estimate, b: Estimate) -> Estimate:
    """B - A of two independent estimates (two arms, or a window and an earlier one)."""
    return Estimate(b.value - a.value, math.hypot(a.standard_error, b.standard_error), a.impressions + b.impressions)


def plain_difference(a: tuple[float, float, float], b: tuple[float, float, float]) -> Estimate | None:
    """B - A of two arms given as (n, sum, sum of squares); None if either has under 2 impressions."""
    mean_a, mean_b = mean_estimate(*a), mean_estimate(*b)
    return None if mean_a is None or mean_b is None else difference(mean_a, mean_b)


@dataclass(frozen=True)
class StratifiedSums:
    """What the stratified difference needs of the queries both arms saw, as five sums of
    u_q = n_A,q + n_B,q and d_q = s_B,q / n_B,q - s_A,q / n_A,q: sums over queries add up, so a
    running comparison moves them by the queries that changed (take a query's old `term` out, put
    its new one in) instead of reading every query again.

        >>> sums = StratifiedSums.of({"q1": (2, 1.0), "q2": (1, 0.2)}, {"q1": (2, 1.2), "q2": (3, 0.9)})
        >>> round(stratified_difference(sums).value, 4)
        0.1
    """

    queries: int = 0
    weight: float = 0.0  # sum u_q
    weighted: float = 0.0  # sum u_q d_q
    weight_squares: float = 0.0  # sum u_q^2
    cross: float = 0.0  # sum u_q^2 d_q
    spread: float = 0.0  # sum u_q^2 d_q^2

    @staticmethod
    def term(a: Cell, b: Cell) -> tuple[int, float, float, float, float, float]:
        """One query's part of each sum, in field order (all 0 unless both arms saw it)."""
        (n_a, s_a), (n_b, s_b) = a, b
        if n_a <= 0 or n_b <= 0:
            return (0, 0.0, 0.0, 0.0, 0.0, 0.0)
        u = n_a + n_b
        d = s_b / n_b - s_a / n_a
        return (1, u, u * d, u * u, u * u * d, u * u * d * d)

    @classmethod
    def of(cls, a: Mapping[str, Cell], b: Mapping[str, Cell]) -> StratifiedSums:
        """The sums over two arms' per-query (n_q, s_q)."""
        terms = [cls.term(a[query], b[query]) for query in a.keys() & b.keys()]
        return cls(sum(term[0] for term in terms), *(math.fsum(term[i] for term in terms) for i in range(1, 6)))


def stratified_difference(sums: StratifiedSums) -> Estimate | None:
    """B - A as the traffic-weighted mean of per-query differences, with its query-clustered
    standard error (see the module's docstring); None under 2 queries in common."""
    if sums.queries < 2:
        return None
    value = sums.weighted / sums.weight
    concentration = sums.weight_squares / sums.weight**2  # sum w_q^2
    if concentration >= 1.0:
        return None
    spread = max(0.0, sums.spread - 2 * value * sums.cross + value * value * sums.weight_squares)
    return Estimate(value, math.sqrt(spread / (1.0 - concentration)) / sums.weight, sums.weight)


def stratified_difference_of(a: Mapping[str, Cell], b: Mapping[str, Cell]) -> Estimate | None:
    """`stratified_difference` of two arms' per-query (n_q, s_q) (query id -> cell)."""
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
