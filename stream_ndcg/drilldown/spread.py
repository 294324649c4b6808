"""A window's figures over its queries, kept running: the query-clustered standard error of a mean
and the query-averaged mean.

Standard library only. For one figure (nDCG: per query its scored impressions n_q and nDCG sum
s_q; DCG: its impressions and DCG sum) a `QuerySpread` holds what `comparisons.clustered_mean`
and `comparisons.query_mean` need, as sums over the queries: Q, sum n_q, sum s_q, sum n_q^2,
sum s_q n_q, sum s_q^2 and sum s_q / n_q. A query's figures move as rows of a sliding window
come and go (`index.QueryIndex`): its old values are taken out and its new ones put in, so a
request costs what changed, not the queries the window holds. Each sum is kept exact, as a whole
number of 2**-1074 (a product, of 2**-2148), so that what is taken out is what was put in and the
figures are those of the queries' sums computed afresh, to the last bit but one rounding.

    spread = QuerySpread()
    spread.move(None, (3.0, 2.1))        # a query enters with 3 impressions and a sum of 2.1
    spread.move((3.0, 2.1), (4.0, 2.9))  # and takes one more
    spread.figures()                     # (None, 0.725): one query, no clustered error yet
"""

from __future__ import annotations

import math
from fractions import Fraction

from stream_ndcg.window_sums import exact

_GRID = 1 << 1074


class QuerySpread:
    """Running exact sums over the queries with impressions of (n_q, s_q)."""

    __slots__ = ("queries", "n", "s", "nn", "sn", "ss", "means")

    def __init__(self) -> None:
        self.queries = 0
        self.n = self.s = self.nn = self.sn = self.ss = self.means = 0

    def move(self, before: tuple[float, float] | None, after: tuple[float, float] | None) -> None:
        """One query's (n_q, s_q) changed from `before` to `after` (None: it had, or has, none)."""
        if before is not None and before[0] > 0:
            self._add(before, -1)
        if after is not None and after[0] > 0:
            self._add(after, 1)

    def _add(self, cell: tuple[float, float], sign: int) -> None:
        n, s = exact(cell[0]), exact(cell[1])
        self.queries += sign
        self.n += sign * n
        self.s += sign * s
        self.nn += sign * n * n
        self.sn += sign * s * n
        self.ss += sign * s * s
        self.means += sign * exact(cell[1] / cell[0])

    def figures(self) -> tuple[float | None, float | None]:
        """(the clustered standard error of the impression-weighted mean, the query-averaged
        mean): `comparisons.clustered_mean`'s error, None under 2 queries; and None without any."""
        if not self.queries:
            return None, None
        query_mean = float(Fraction(self.means, _GRID) / self.queries)
        if self.queries < 2:
            return None, query_mean
        n = Fraction(self.n, _GRID)
        mean = Fraction(self.s, _GRID) / n
        square = _GRID * _GRID
        spread = Fraction(self.ss, square) - 2 * mean * Fraction(self.sn, square) + mean * mean * Fraction(
            self.nn, square)
        variance = Fraction(self.queries, self.queries - 1) * spread / (n * n)
        return math.sqrt(max(0.0, float(variance))), query_mean
