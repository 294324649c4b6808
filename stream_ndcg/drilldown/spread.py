"""A window's figures over its queries, kept running: the query-clustered standard error of a mean
and the query-averaged mean.

Standard library only. For one figure (nDCG: per query its scored impressions n_q and nDCG sum
s_q; DCG: its impressions and DCG sum) a `QuerySpread` holds what `comparisons.clustered_mean`
and `comparisons.query_mean` need, as sums over the queries: Q, sum n_q, sum s_q, sum n_q^2,
sum s_q n_q, sum s_q^2 and sum s_q / n_q. A query's figures move as rows of a sliding window
come and go (`index.QueryIndex`): its old values are taken out and its new ones put in, so a
request costs what changed, not the queries the window holds. Each sum is kept exact, as a whole
number of 2**-b (a product, of 2**-2b), b the finest binary place any value put in needed, so
that what is taken out is what was put in and the figures are those of the queries' sums
computed afresh, to the last bit but one rounding. A fixed grid of 2**-1074 (the least double)
would be as exact, but its numbers of over a thousand bits made each move about three times dearer.

    spread = QuerySpread()
    spread.move(None, (3.0, 2.1))        # a query enters with 3 impressions and a sum of 2.1
    spread.move((3.0, 2.1), (4.0, 2.9))  # and takes one more
    spread.figures()                     # (None, 0.725): one query, no clustered error yet
"""

from __future__ import annotations

import math


class QuerySpread:
    """Running exact sums over the queries with impressions of (n_q, s_q)."""

    __slots__ = ("queries", "bits", "n", "s", "nn", "sn", "ss", "means", "_figures")

    def __init__(self) -> None:
        self.queries = 0
        # The grid's binary places: n, s and means are whole numbers of 2**-bits, nn, sn and ss of 2**-2bits.
        self.bits = 0
        self.n = self.s = self.nn = self.sn = self.ss = self.means = 0
        # What `figures` gave since the last move (None: to be worked out again).
        self._figures: tuple[float | None, float | None] | None = None

    def move(self, before: tuple[float, float] | None, after: tuple[float, float] | None) -> None:
        """One query's (n_q, s_q) changed from `before` to `after` (None: it had, or has, none)."""
        if before is not None and before[0] > 0:
            self._add(before, -1)
        if after is not None and after[0] > 0:
            self._add(after, 1)

    def _refine(self, bits: int) -> None:
        """Put the sums on the finer grid of 2**-bits."""
        finer = bits - self.bits
        self.n <<= finer
        self.s <<= finer
        self.means <<= finer
        self.nn <<= 2 * finer
        self.sn <<= 2 * finer
        self.ss <<= 2 * finer
        self.bits = bits

    def _add(self, cell: tuple[float, float], sign: int) -> None:
        n, n_scale = cell[0].as_integer_ratio()
        s, s_scale = cell[1].as_integer_ratio()
        quotient, quotient_scale = (cell[1] / cell[0]).as_integer_ratio()
        # A double's denominator is a power of two: its binary places are its bit length less one.
        grid = self.bits + 1
        finest = max(n_scale, s_scale, quotient_scale).bit_length()
        if finest > grid:
            self._refine(finest - 1)
            grid = finest
        n <<= grid - n_scale.bit_length()
        s <<= grid - s_scale.bit_length()
        quotient <<= grid - quotient_scale.bit_length()
        nn, sn, ss = n * n, s * n, s * s
        if sign < 0:
            n, s, quotient, nn, sn, ss = -n, -s, -quotient, -nn, -sn, -ss
        self.queries += sign
        self.n += n
        self.s += s
        self.nn += nn
        self.sn += sn
        self.ss += ss
        self.means += quotient
        self._figures = None

    def figures(self) -> tuple[float | None, float | None]:
        """(the clustered standard error of the impression-weighted mean, the query-averaged
        mean): `comparisons.clustered_mean`'s error, None under 2 queries; and None without any."""
        if self._figures is None:
            self._figures = self._worked_out()
        return self._figures

    def _worked_out(self) -> tuple[float | None, float | None]:
        if not self.queries:
            return None, None
        # int / int rounds the exact quotient once, correctly.
        query_mean = self.means / (self.queries << self.bits)
        if self.queries < 2:
            return None, query_mean
        # With m = s / n, Q / (Q - 1) * (ss - 2 m sn + m^2 nn) / n^2, over n^2 put in whole numbers:
        # the grid's scale cancels (four places above and below).
        n, s = self.n, self.s
        spread = self.ss * n * n - 2 * s * n * self.sn + s * s * self.nn
        variance = self.queries * spread / ((self.queries - 1) * n ** 4)
        return math.sqrt(max(0.0, variance)), query_mean
