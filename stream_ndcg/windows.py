"""Time buckets and windows: which buckets the state keeps, and the means a window reports.

Standard library only. Aggregates are sums per (time bucket, segment key,
field) (see `vocabulary`); a window is a run of whole buckets, and its means
are the fsum of a field over its buckets divided by the fsum of the field's
denominator. The replay reports the same means over all its impressions,
computed by the same function.

    >>> oldest_kept_bucket(clock_ms=600_000, horizon_ms=300_000, bucket_ms=60_000)
    5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from stream_ndcg.comparisons import standard_error
from stream_ndcg.vocabulary import (
    IMPRESSIONS,
    MOMENTS,
    AggregateKey,
    dcg_at,
    dcg_squares_at,
    judged_at,
    ndcg_at,
    ndcg_squares_at,
    scored_at,
    segment_values,
)


def oldest_kept_bucket(clock_ms: float, horizon_ms: int, bucket_ms: int) -> int:
    """The horizon rule: the first bucket kept at `clock_ms`. Every earlier one is behind every
    window and its grace, so its groups, impression ids, ranked lists and sums are dropped."""
    return int((clock_ms - horizon_ms) // bucket_ms)


def kept_until_ms(bucket: int, horizon_ms: int, bucket_ms: int) -> int:
    """The clock at which `bucket` falls behind the horizon: the least `clock_ms` for which
    `oldest_kept_bucket` is past it (what a store's key TTLs count down to)."""
    return (bucket + 1) * bucket_ms + horizon_ms


def bucket_ttl_ms(bucket: int, clock_ms: float | None, horizon_ms: int, bucket_ms: int) -> int:
    """How long a store keeps what it writes of `bucket` at `clock_ms`: until the bucket itself is
    behind the horizon, not just a horizon after the write (an event may be stamped ahead of the
    clock); never less than a horizon and a bucket, which is also the answer without a clock."""
    least = horizon_ms + bucket_ms
    return least if clock_ms is None else max(least, int(kept_until_ms(bucket, horizon_ms, bucket_ms) - clock_ms))


def window_buckets(now_ms: int, window_ms: int, bucket_ms: int) -> tuple[int, int]:
    """The buckets [first, last] of the window that ends at `now_ms`: the last
    window_ms / bucket_ms buckets, the one holding `now_ms` included."""
    last = now_ms // bucket_ms
    return last - window_ms // bucket_ms + 1, last


def mean(total: float, count: float) -> float | None:
    """A mean, None when there is nothing to average (never 0: an empty window is not a bad one)."""
    return total / count if count else None


def field_sums(
    aggregates: Mapping[AggregateKey, float],
    buckets: Callable[[int], bool] = lambda _: True,
) -> dict[str, float]:
    """Each field summed over the buckets that `buckets` admits, all segments of `aggregates` together."""
    parts: dict[str, list[float]] = {}
    for (bucket, _, name), value in aggregates.items():
        if buckets(bucket):
            parts.setdefault(name, []).append(value)
    # fsum: a total does not depend on the order its parts were added in.
    return {name: math.fsum(values) for name, values in parts.items()}


def means(sums: Mapping[str, float], cutoffs: Iterable[int]) -> dict[str, dict[str, float | None]]:
    """Per cut-off, the sums and their means: nDCG over the scored impressions, DCG and the judged
    ratio over all of them; a mean with nothing to average is None. With them the sums of squares
    and each mean's impression-level standard error (`comparisons.standard_error`): None under 2
    impressions, and when the squares do not hold every impression (`vocabulary.MOMENTS`)."""
    impressions = sums.get(IMPRESSIONS, 0.0)
    squared = sums.get(MOMENTS, 0.0)
    complete = squared == impressions
    rows: dict[str, dict[str, float | None]] = {}
    for k in cutoffs:
        scored, ndcg, dcg, judged, ndcg_squares, dcg_squares = (sums.get(name(k), 0.0) for name in (
            scored_at, ndcg_at, dcg_at, judged_at, ndcg_squares_at, dcg_squares_at))
        rows[str(k)] = {
            "ndcg_mean": mean(ndcg, scored),
            "dcg_mean": mean(dcg, impressions),
            "judged_ratio": mean(judged, impressions),
            "ndcg_sum": ndcg,
            "dcg_sum": dcg,
            "judged_sum": judged,
            "scored_impressions": scored,
            "impressions": impressions,
            "ndcg_squares": ndcg_squares,
            "dcg_squares": dcg_squares,
            "squared_impressions": squared,
            "ndcg_standard_error": standard_error(scored, ndcg, ndcg_squares) if complete else None,
            "dcg_standard_error": standard_error(impressions, dcg, dcg_squares) if complete else None,
        }
    return rows


def window_means(
    aggregates: Mapping[AggregateKey, float],
    cutoffs: Iterable[int],
    buckets: Callable[[int], bool] = lambda _: True,
) -> dict[str, dict[str, float | None]]:
    """`means` of the buckets that `buckets` admits, all segments of `aggregates` together."""
    return means(field_sums(aggregates, buckets), cutoffs)


def by_segment_values(aggregates: Mapping[AggregateKey, float],
                      labels: tuple[str, ...]) -> dict[tuple[str, ...], dict[AggregateKey, float]]:
    """The aggregates split by the values of the exported segment labels (segments that differ
    only in other keys fall together)."""
    parts: dict[tuple[str, ...], dict[AggregateKey, float]] = {}
    for key, value in aggregates.items():
        parts.setdefault(tuple(segment_values(key[1], labels)), {})[key] = value
    return parts
