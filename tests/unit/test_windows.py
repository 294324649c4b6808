"""The horizon rule, the retention it implies, and the means of a window."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_ndcg.metric import ListScore
from stream_ndcg.offline.totals import ScoreTotals
from stream_ndcg.vocabulary import IMPRESSIONS, dcg_at, judged_at, ndcg_at, scored_at
from stream_ndcg.windows import bucket_ttl_ms, kept_until_ms, means, oldest_kept_bucket, window_means

buckets_ms = st.integers(1, 3_600_000)
horizons_ms = st.integers(0, 10 * 86_400_000)


def test_the_horizon_keeps_the_bucket_holding_clock_minus_horizon() -> None:
    assert oldest_kept_bucket(clock_ms=600_000, horizon_ms=300_000, bucket_ms=60_000) == 5
    assert oldest_kept_bucket(clock_ms=599_999, horizon_ms=300_000, bucket_ms=60_000) == 4


# Clocks below 2**43 ms (the year 2248): above it a double's steps are past a two-thousandth of a
# millisecond, and a clock 0.999 ms past a whole one can round up to the next.
@given(st.integers(0, 2**43), horizons_ms, buckets_ms, st.floats(0, 0.999))
def test_a_wall_clock_with_a_fraction_of_a_millisecond_keeps_the_same_buckets(
        clock: int, horizon: int, bucket: int, fraction: float) -> None:
    assert oldest_kept_bucket(clock + fraction, horizon, bucket) == oldest_kept_bucket(clock, horizon, bucket)
    assert isinstance(oldest_kept_bucket(clock + fraction, horizon, bucket), int)


@given(st.integers(-1000, 10**8), horizons_ms, buckets_ms)
def test_a_bucket_is_kept_until_exactly_kept_until_ms(bucket: int, horizon: int, bucket_ms: int) -> None:
    until = kept_until_ms(bucket, horizon, bucket_ms)
    assert oldest_kept_bucket(until - 1, horizon, bucket_ms) <= bucket < oldest_kept_bucket(until, horizon, bucket_ms)


@given(st.integers(0, 10**8), st.one_of(st.none(), st.floats(0, 2e13)), horizons_ms, buckets_ms)
def test_a_bucket_written_outlives_its_place_in_the_horizon(
        bucket: int, clock: float | None, horizon: int, bucket_ms: int) -> None:
    ttl = bucket_ttl_ms(bucket, clock, horizon, bucket_ms)
    assert ttl >= horizon + bucket_ms
    if clock is not None:
        assert clock + ttl >= kept_until_ms(bucket, horizon, bucket_ms) - 1


def test_a_mean_with_nothing_to_average_is_none() -> None:
    row = means({}, (5,))["5"]
    assert row["ndcg_mean"] is None and row["dcg_mean"] is None and row["judged_ratio"] is None
    assert row["impressions"] == 0.0


def test_window_means_sum_only_the_buckets_admitted() -> None:
    aggregates = {(1, "{}", IMPRESSIONS): 2.0, (1, "{}", ndcg_at(3)): 1.5, (1, "{}", scored_at(3)): 2.0,
                  (2, "{}", IMPRESSIONS): 1.0, (2, "{}", ndcg_at(3)): 0.25, (2, "{}", scored_at(3)): 1.0,
                  (2, "{}", dcg_at(3)): 3.0, (2, '{"variant":"A"}', judged_at(3)): 0.5}
    assert window_means(aggregates, (3,), lambda b: b == 2)["3"] == {
        "ndcg_mean": 0.25, "dcg_mean": 3.0, "judged_ratio": 0.5, "ndcg_sum": 0.25, "dcg_sum": 3.0,
        "judged_sum": 0.5, "scored_impressions": 1.0, "impressions": 1.0, "ndcg_squares": 0.0, "dcg_squares": 0.0,
        "squared_impressions": 0.0, "ndcg_standard_error": None, "dcg_standard_error": None}
    assert window_means(aggregates, (3,))["3"]["ndcg_mean"] == 1.75 / 3


scores = st.builds(
    lambda d, n, j: ListScore(dcg={3: d}, ndcg={3: n}, judged_ratio={3: j}),
    st.floats(-50, 50), st.none() | st.floats(-1, 1), st.sampled_from([0.0, 1 / 3, 2 / 3, 1.0]))


@given(st.lists(scores, max_size=30))
def test_the_replay_reports_the_window_means_of_all_its_impressions(listed: list[ListScore]) -> None:
    defined = [s.ndcg[3] for s in listed if s.ndcg[3] is not None]
    row = ScoreTotals((3,), listed).means()["3"]
    errors = {name: row.pop(name) for name in ("ndcg_standard_error", "dcg_standard_error")}
    # The replay's definition, written out: means over the scored and over all impressions, each
    # with the standard deviation of its values over the square root of their number.
    assert row == {
        "ndcg_mean": math.fsum(v for v in defined if v is not None) / len(defined) if defined else None,
        "dcg_mean": math.fsum(s.dcg[3] for s in listed) / len(listed) if listed else None,
        "judged_ratio": math.fsum(s.judged_ratio[3] for s in listed) / len(listed) if listed else None,
        "scored_impressions": len(defined), "impressions": len(listed),
        # Added without their queries: no figure over queries.
        "ndcg_clustered_standard_error": None, "dcg_clustered_standard_error": None, "ndcg_query_mean": None,
        "dcg_query_mean": None, "queries": 0}
    for name, values in (("ndcg_standard_error", [v for v in defined if v is not None]),
                         ("dcg_standard_error", [s.dcg[3] for s in listed])):
        if len(values) < 2:
            assert errors[name] is None
        else:
            assert errors[name] == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), abs=1e-6)
    assert type(row["scored_impressions"]) is int and type(row["impressions"]) is int
