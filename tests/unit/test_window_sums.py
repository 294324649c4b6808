"""Running window sums against the buckets summed afresh, through any order of commits and scrapes."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_ndcg.engine import BatchOutcome
from stream_ndcg.state.base import Commit
from stream_ndcg.state.memory import MemoryStore
from stream_ndcg.window_sums import WindowSums, add_exactly, exact, fsum_of, rounded

SEGMENTS = ('{"variant":"A"}', '{"variant":"B"}', '{"variant":"A","device":"m"}', "")
FIELDS = ("impressions", "ndcg@3")
WINDOWS = (1, 4)  # in buckets of 1 ms: the bucket is the time

values = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([1e-300, 5e-324, 0.1, 1e16, -1e16]))
commits = st.tuples(st.just("commit"), st.integers(0, 2), st.integers(0, 9), st.sampled_from(SEGMENTS),
                    st.sampled_from(FIELDS), values)
scrapes = st.tuples(st.just("scrape"), st.integers(0, 12))
forgets = st.tuples(st.just("forget"))


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_exact_and_rounded_are_inverse(value: float) -> None:
    assert rounded(exact(value)) == value
    assert Fraction(exact(value), 2**1074) == Fraction(value)


def test_exact_holds_at_the_ends_of_the_doubles() -> None:
    # Subnormals (a right shift onto the grid), the least and greatest doubles, both zeros.
    for value in [5e-324, -5e-324, sys.float_info.min, sys.float_info.min / 3, -sys.float_info.min / 1e10,
                  sys.float_info.max, -sys.float_info.max, 0.0, -0.0]:
        assert Fraction(exact(value), 2**1074) == Fraction(value)
        assert rounded(exact(value)) == value


# Whole numbers of 2**-1074 of every size, those of a sum of doubles' halves (ties) among them, and
# those at the ends of the scaled path (`rounded`): 53 bits (the least normal double) and 1,023.
totals = st.one_of(
    st.integers(-(2**1100), 2**1100),
    st.builds(lambda bits, low, sign: sign * ((1 << bits) + low), st.integers(0, 1100), st.integers(0, 2**60),
              st.sampled_from([1, -1])),
    st.builds(lambda bits, sign: sign * ((1 << bits) | (1 << max(bits - 53, 0))), st.integers(0, 1100),
              st.sampled_from([1, -1])),
)


@settings(max_examples=500)
@given(totals)
def test_a_total_is_rounded_as_its_exact_quotient_is(total: int) -> None:
    # int / int rounds correctly; the scaled path must give the same double.
    assert rounded(total) == total / 2**1074


def test_a_total_of_many_is_rounded_once() -> None:
    parts = [0.1] * 10 + [1e16, -1e16]
    assert rounded(sum(exact(v) for v in parts)) == math.fsum(parts) != sum(parts)
    assert rounded(exact(sys.float_info.min / 4)) == sys.float_info.min / 4


def _expected(store: MemoryStore, first: int, last: int) -> dict[tuple[str, ...], dict[str, float]]:
    """The window summed afresh from every partition's buckets: one correctly rounded sum each."""
    parts: dict[tuple[str, ...], dict[str, list[float]]] = {}
    for read in store.read_aggregates({}, since_bucket=first):
        for bucket, sums in read.buckets.items():
            if bucket <= last:
                for (segment, name), value in sums.items():
                    values_of = ("none",) if not segment else (segment.split('"')[3],)
                    parts.setdefault(values_of, {}).setdefault(name, []).append(value)
    return {key: {name: math.fsum(vs) for name, vs in fields.items()} for key, fields in parts.items()}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(commits, scrapes, forgets), max_size=60))
def test_running_sums_equal_the_window_summed_afresh(steps: list[tuple[object, ...]]) -> None:
    store = MemoryStore(bucket_ms=1)
    epochs = {p: store.claim(f"t:{p}") for p in range(3)}
    offsets = dict.fromkeys(range(3), 0)
    sums = WindowSums(WINDOWS, ("variant",))
    for step in steps:
        if step[0] == "commit":
            _, partition, bucket, segment, name, value = step
            assert isinstance(partition, int) and isinstance(bucket, int) and isinstance(value, float)
            outcome = BatchOutcome(aggregates={(bucket, str(segment), str(name)): value})
            expected = offsets[partition] or None
            offsets[partition] += 1
            store.commit([Commit(f"t:{partition}", epochs[partition], outcome, offsets[partition], expected)])
        elif step[0] == "forget":
            # A reader whose marks are lost (a restart) reads every partition whole.
            sums = WindowSums(WINDOWS, ("variant",))
        else:
            now = step[1]
            assert isinstance(now, int)
            ranges = {w: (now - w + 1, now) for w in WINDOWS}
            oldest = min(first for first, _ in ranges.values())
            sums.apply(store.read_aggregates(sums.marks(oldest), oldest), oldest)
            sums.slide(ranges)
            for window, (first, last) in ranges.items():
                assert sums.totals(window) == _expected(store, first, last), (window, now)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e150, max_value=1e150), max_size=30))
def test_a_pair_of_doubles_moves_a_sum_by_exactly_the_values_added_to_it(values: list[float]) -> None:
    # Values of far apart magnitudes pass what a pair holds: it goes into the whole number and starts again.
    highs, lows, totals = [0.0, 0.0], [0.0, 0.0], [exact(2.5), 0]
    for value in values:
        add_exactly(highs, lows, 0, value, totals)
    held = totals[0] + exact(highs[0]) + exact(lows[0])
    assert held == exact(2.5) + sum(exact(value) for value in values)
    assert rounded(held) == math.fsum([2.5, *values])
    assert totals[1] == 0 and highs[1] == lows[1] == 0.0


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300), min_size=1,
                max_size=10))
def test_a_sum_of_terms_is_their_fsum(terms: list[float]) -> None:
    assert fsum_of(terms, len(terms)) == math.fsum(terms)
