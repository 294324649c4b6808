"""Simulated A/B streams with query-level effects, kept as the per-query sums a store keeps.

Many streams at once, minute by minute, with numpy. Each stream has its own 2,000 queries:
Zipf popularity (exponent 1, so the head query takes about an eighth of the traffic), each query
its own true nDCG (Beta(2, 1.5), clipped to [0.05, 0.95]: query difficulty is most of the
variance), each impression's nDCG its query's plus triangular noise as wide as [0, 1] lets it be,
up to +-0.4 (a deviation of 0.16 at most, against 0.23 between queries). Impressions split 50/50
at random; arm B's true nDCG is `drop` lower for every query from minute 0 on.

`Running` keeps, per stream, what the comparisons read: each arm's (n, sum, squares) and the
sums of `StratifiedSums`, moved by the cells a minute changed (a changed query's old term out, its
new one in), the way a store moves running sums; `queries` gives a stream's per-query sums, to check
them against `StratifiedSums.of`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

QUERIES = 2_000
ZIPF_EXPONENT = 1.0
NOISE = 0.4


@dataclass(frozen=True)
class Minute:
    """One minute's impressions of every stream: whose, which arm, which (stream, query) cell, the nDCG."""

    minute: int
    stream: Ints
    arm: Ints
    cell: Ints  # stream * QUERIES + query
    value: Floats


def minutes(streams: int, rate: float, drop: float, first: int, last: int, seed: int) -> Iterator[Minute]:
    """The impressions of minutes first..last (Poisson(rate) a minute in each stream)."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, QUERIES + 1) ** ZIPF_EXPONENT
    # Zipf by table lookup: each query's share rounded to 2^-20 (the rarest has 64 slots of the table).
    slots = (np.arange(2**20) + 0.5) / 2**20
    table = np.minimum(np.searchsorted(np.cumsum(popularity / popularity.sum()), slots), QUERIES - 1)
    truth = np.clip(rng.beta(2.0, 1.5, size=streams * QUERIES), 0.05, 0.95)
    for minute in range(first, last + 1):
        stream = np.repeat(np.arange(streams), rng.poisson(rate, streams))
        cell = stream * QUERIES + table[rng.integers(0, 2**20, stream.size)]
        arm = rng.integers(0, 2, stream.size)
        mean = truth[cell] - (drop * arm if minute >= 0 else 0.0)
        # Triangular noise around the query's nDCG, as wide as [0, 1] lets it be, up to +-0.4.
        spread = np.minimum(np.minimum(mean, 1.0 - mean), NOISE)
        value = mean + spread * (rng.random(stream.size) + rng.random(stream.size) - 1.0)
        yield Minute(minute, stream, arm, cell, value)


def _terms(cells: Floats) -> Floats:
    """`StratifiedSums.term` of many cells at once: rows n_A, n_B, s_A, s_B, ss_A, ss_B of cells ->
    the 11 sums' rows."""
    n_a, n_b, s_a, s_b, ss_a, ss_b = cells
    seen_a, seen_b = n_a > 0, n_b > 0
    both = seen_a & seen_b
    safe_a, safe_b = np.maximum(n_a, 1), np.maximum(n_b, 1)
    u = np.where(both, n_a + n_b, 0.0)
    u2 = u * u
    terms = np.empty((11, cells.shape[1]))
    terms[0], terms[1] = both, u
    terms[2] = u * np.where(both, s_b / safe_b - s_a / safe_a, 0.0)
    terms[3], terms[4] = u2 / safe_a, u2 / safe_b
    terms[5], terms[6], terms[7] = n_a, seen_a, np.where(seen_a, ss_a - s_a * s_a / safe_a, 0.0)
    terms[8], terms[9], terms[10] = n_b, seen_b, np.where(seen_b, ss_b - s_b * s_b / safe_b, 0.0)
    return terms


class Running:
    """Per stream: each arm's (n, sum, squares) and the stratified sums, over the impressions
    applied so far (a cumulative comparison, or a sliding window when old minutes are taken out)."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        # Rows n_A, n_B, s_A, s_B, ss_A, ss_B; a column per (stream, query) cell.
        self.cells = np.zeros((6, streams * QUERIES))
        self.plain = np.zeros((streams, 2, 3))
        self.stratified = np.zeros((streams, 11))

    def apply(self, changes: list[tuple[Minute, float]]) -> None:
        """Add (sign +1) or take out (-1) minutes of impressions."""
        stream = np.concatenate([m.stream for m, _ in changes])
        if stream.size == 0:
            return
        arm = np.concatenate([m.arm for m, _ in changes])
        cell = np.concatenate([m.cell for m, _ in changes])
        value = np.concatenate([m.value for m, _ in changes])
        sign = np.concatenate([np.full(m.stream.size, sign) for m, sign in changes])
        weights = (sign, sign * value, sign * value * value)
        arm_of_stream = stream * 2 + arm
        for j, weight in enumerate(weights):
            self.plain[:, :, j] += np.bincount(arm_of_stream, weight, 2 * self.streams).reshape(self.streams, 2)
        # Sorted, the cells touched are read and written in the order they lie in memory.
        touched, place = np.unique(cell, return_inverse=True)
        key, size = arm * touched.size + place, 2 * touched.size
        current = self.cells[:, touched]
        before = _terms(current)
        for j, weight in enumerate(weights):
            current[2 * j:2 * j + 2] += np.bincount(key, weight, size).reshape(2, -1)
        self.cells[:, touched] = current
        change = _terms(current) - before
        # Per stream: its cells lie together among the sorted ones.
        owner = touched // QUERIES
        starts = np.flatnonzero(np.diff(owner, prepend=-1))
        self.stratified[owner[starts]] += np.add.reduceat(change, starts, axis=1).T

    def queries(self, stream: int, arm: int) -> dict[str, tuple[float, float, float]]:
        """A stream's per-query (n_q, s_q, ss_q) in one arm, as the drill-down would give them."""
        n, s, ss = self.cells[arm::2, stream * QUERIES:(stream + 1) * QUERIES]
        return {f"q{q}": (float(n[q]), float(s[q]), float(ss[q])) for q in np.flatnonzero(n > 0)}
